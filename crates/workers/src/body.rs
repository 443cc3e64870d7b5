//! A queue message body as the bytes the core decodes.
//!
//! Producers send strings (`contentType: "text"`), bytes (`"bytes"`) or JSON values
//! (`"json"`, the default); all three reach the core as the same UTF-8 JSON text.

use js_sys::{ArrayBuffer, JSON, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};

/// The body's bytes. A value JSON cannot represent (`undefined`, a V8-serialized
/// Map, a cycle) becomes empty bytes, which the core rejects as malformed, so it
/// takes the poison path instead of vanishing.
pub fn body_bytes(body: &JsValue) -> Vec<u8> {
    if let Some(text) = body.as_string() {
        return text.into_bytes();
    }
    if let Some(bytes) = body.dyn_ref::<Uint8Array>() {
        return bytes.to_vec();
    }
    if body.is_instance_of::<ArrayBuffer>() {
        return Uint8Array::new(body).to_vec();
    }
    if ArrayBuffer::is_view(body) {
        // Any other typed array or DataView: its bytes, not its numbers.
        let view: &js_sys::DataView = body.unchecked_ref();
        return Uint8Array::new_with_byte_offset_and_length(
            &view.buffer(),
            view.byte_offset() as u32,
            view.byte_length() as u32,
        )
        .to_vec();
    }
    match JSON::stringify(body) {
        Ok(text) => text.as_string().unwrap_or_default().into_bytes(),
        Err(_) => Vec::new(),
    }
}
