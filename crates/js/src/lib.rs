//! Placeholder: the wasm-bindgen JS package (issue #5).
