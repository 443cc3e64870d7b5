//! A queue message body as the bytes the core decodes.
//!
//! Producers send strings (`contentType: "text"`), bytes (`"bytes"`), JSON values
//! (`"json"`, the default) or structured clones (`"v8"`); all of them reach the
//! core as the same UTF-8 JSON text. A JS `Map` (what serde-wasm-bindgen makes of
//! a serde map, e.g. a `serde_json::Value` sent with workers-rs `Queue::send`) is
//! read as the object it stands for wherever it survives (`"v8"` keeps it; the
//! `"json"` content type has already turned it into `{}` in the producer, see
//! [`crate::send_envelope`]).

use js_sys::{ArrayBuffer, JSON, JsString, Map, Object, Uint8Array};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::prelude::wasm_bindgen;
use wasm_bindgen::{JsCast, JsValue};

#[wasm_bindgen]
extern "C" {
    /// A JS string, for the one method js-sys does not bind.
    type Text;
    /// `String.prototype.isWellFormed` (no lone surrogate), one call.
    #[wasm_bindgen(method, js_name = isWellFormed)]
    fn is_well_formed(this: &Text) -> bool;
}

/// The body's bytes. A value JSON cannot represent (`undefined`, a cycle, a
/// BigInt) becomes empty bytes, which the core rejects as malformed, so it takes
/// the poison path instead of vanishing.
///
/// A text body with a lone surrogate (a structured clone, `contentType: "v8"`,
/// keeps one; `"text"` and `"json"` do not) has no UTF-8 form: `as_string`
/// would make it U+FFFD, and two different ids one key. Its bytes are the
/// surrogate's generalized UTF-8 instead, which the core refuses as not UTF-8.
pub(crate) fn body_bytes(body: &JsValue) -> Vec<u8> {
    if let Some(text) = body.dyn_ref::<JsString>() {
        if !text.unchecked_ref::<Text>().is_well_formed() {
            return wtf8(text);
        }
        return String::from(text).into_bytes();
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
    // Plain JSON first (no call back into wasm per value). JSON.stringify writes
    // a Map as `{}`: only when the text has an empty object (or the body is a
    // Map) can a Map have been lost, and then the replacer reads Maps as objects.
    let plain = stringify(body, None);
    if !body.is_instance_of::<Map>() && plain.as_ref().is_some_and(|t| !t.contains("{}")) {
        return plain.unwrap_or_default().into_bytes();
    }
    let replacer = Closure::<dyn FnMut(JsValue, JsValue) -> JsValue>::new(
        |_key: JsValue, value: JsValue| -> JsValue {
            if value.is_instance_of::<Map>() {
                Object::from_entries(&value).map_or(value, Into::into)
            } else {
                value
            }
        },
    );
    stringify(body, Some(replacer.as_ref()))
        .unwrap_or_default()
        .into_bytes()
}

/// Whether `bytes`, what [`body_bytes`] made of `body`, hold the body whole
/// as UTF-8 text. Not when JSON could not write the value (a BigInt, a cycle,
/// `undefined`: empty bytes), nor when the text is not UTF-8 (a lone
/// surrogate, binary bytes), nor when the text leaves out a part of it
/// ([`text_loses_part`]): a dead letter carries such a body as the value
/// itself (`crate::consumer`), since text would lose it.
pub(crate) fn is_whole_text(body: &JsValue, bytes: &[u8]) -> bool {
    let binary = body.is_instance_of::<ArrayBuffer>() || ArrayBuffer::is_view(body);
    let unwritable = bytes.is_empty() && !body.is_string() && !binary;
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    // What loses a part writes `{}`, `null` or a typed array's numbered keys:
    // only text with one of them is looked at value by value (a callback per
    // value, for a letter the size of the limit: a review).
    let may_lose = ["{}", "null", "\"0\":"]
        .iter()
        .any(|mark| text.contains(mark));
    let object = body.is_object() && !binary;
    !unwritable && (!object || !may_lose || !text_loses_part(body))
}

/// Whether the JSON text of `body`, an object, loses a part of it: bytes in
/// it (an `ArrayBuffer` is written `{}`, a typed array as numbered keys), a
/// `Set`, `RegExp` or `Error` (each written `{}`), a number JSON has no text
/// for (`NaN`, `Infinity`: `null`). A letter holding a binary body came round
/// a second time with `"body": {}` (a review): its bytes were gone.
fn text_loses_part(body: &JsValue) -> bool {
    let lost = std::rc::Rc::new(std::cell::Cell::new(false));
    let seen = lost.clone();
    let replacer = Closure::<dyn FnMut(JsValue, JsValue) -> JsValue>::new(
        move |_key: JsValue, value: JsValue| -> JsValue {
            let bytes = value.is_instance_of::<ArrayBuffer>() || ArrayBuffer::is_view(&value);
            let empty = value.is_instance_of::<js_sys::Set>()
                || value.is_instance_of::<js_sys::RegExp>()
                || value.is_instance_of::<js_sys::Error>();
            let no_text = value.as_f64().is_some_and(|n| !n.is_finite());
            if bytes || empty || no_text {
                seen.set(true);
            }
            // A Map is read as its object (as `body_bytes` does), the values
            // in it looked at too.
            match value.is_instance_of::<Map>() {
                true => Object::from_entries(&value).map_or(value, Into::into),
                false => value,
            }
        },
    );
    let _ = JSON::stringify_with_replacer(body, replacer.as_ref());
    lost.get()
}

fn stringify(body: &JsValue, replacer: Option<&JsValue>) -> Option<String> {
    let text = match replacer {
        None => JSON::stringify(body),
        Some(replacer) => JSON::stringify_with_replacer(body, replacer),
    };
    text.ok().and_then(|t| t.as_string())
}

/// `text` as generalized UTF-8 (WTF-8): UTF-8 where it is well formed, a lone
/// surrogate as its own three bytes (invalid UTF-8, refused by the core at
/// exactly that byte).
fn wtf8(text: &JsString) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.length() as usize);
    for unit in char::decode_utf16(text.iter()) {
        match unit {
            Ok(c) => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            Err(lone) => {
                let u = lone.unpaired_surrogate();
                out.extend_from_slice(&[
                    0xE0 | (u >> 12) as u8,
                    0x80 | ((u >> 6) & 0x3F) as u8,
                    0x80 | (u & 0x3F) as u8,
                ]);
            }
        }
    }
    out
}
