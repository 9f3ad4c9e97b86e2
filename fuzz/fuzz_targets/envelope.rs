//! The envelope view: never panics, and agrees with a full parse about what the frame is.
#![no_main]

use coda_shim::frame::{Frame, Kind};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // With the shim's own bound on nesting, as a layer reads a frame.
    let full = coda_shim::json::from_slice::<Value>(data);
    match Frame::parse(data.to_vec()) {
        Ok(frame) => {
            let v = match full {
                Ok(v) => v,
                // A lone UTF-16 surrogate escape: the frame check takes it, serde_json does not; a layer that
                // must act on such a frame answers it with an error (Cx::unreadable).
                Err(e) if e.to_string().contains("surrogate") || e.to_string().contains("hex escape") => return,
                Err(e) => panic!("the envelope accepted what is not JSON: {e}"),
            };
            assert_eq!(frame.bytes(), data, "bytes are kept as they came");
            if !matches!(frame.kind(), Kind::Batch) {
                // The kind read with the envelope is the one a full parse finds (for repeated keys, the last).
                let want = v.pointer("/params/update/sessionUpdate").and_then(Value::as_str);
                assert_eq!(frame.session_update(), want);
            }
            match frame.kind() {
                Kind::Batch => assert!(v.as_array().is_some_and(|a| !a.is_empty())),
                Kind::Request { method, id } => {
                    assert_eq!(v["method"].as_str(), Some(method.as_str()));
                    assert!(v.get("id").is_some());
                    let _ = id.to_value();
                }
                Kind::Notification { method } => {
                    assert_eq!(v["method"].as_str(), Some(method.as_str()));
                    assert!(v.get("id").is_none());
                }
                Kind::Response { .. } => assert!(v.get("result").is_some() || v.get("error").is_some()),
            }
        }
        Err(e) => assert!(e.code == -32700 || e.code == -32600),
    }
});
