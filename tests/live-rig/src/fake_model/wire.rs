//! Each API's answer on the wire: the HTTP response for a scripted reply, and the model list.
//!
//! Chat completions as SSE or JSON, the Responses API as SSE, errors with their retry headers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::origin::Origin;
use super::request::Api;
use super::script::{Reply, decide, describe};

/// The HTTP answer to one request.
pub(super) struct Answer {
    pub(super) response: Response<Full<Bytes>>,
    /// Close the connection instead of answering.
    pub(super) reset: bool,
    /// A one-line description, for the request's record.
    pub(super) summary: String,
    /// How long to wait before answering (`[[delay:MS]]`).
    pub(super) delay: Duration,
}

/// The answer to a request of `api`: the model list, a 404, or the scripted reply in the API's format.
pub(super) fn answer(
    api: Api,
    origin: Origin,
    method: &Method,
    body: &Value,
    prompts: &mut HashMap<String, u32>,
) -> Answer {
    let no_delay = Duration::ZERO;
    match api {
        Api::Models => {
            let models =
                json!({"object":"list","data":[{"id":"fake-model","object":"model","created":0,"owned_by":"fake"}]});
            return Answer {
                response: json_response(200, &models),
                reset: false,
                summary: "model list".into(),
                delay: no_delay,
            };
        }
        Api::Other => {
            if *method == Method::GET {
                return Answer {
                    response: json_response(200, &json!({"ok":true})),
                    reset: false,
                    summary: "ok".into(),
                    delay: no_delay,
                };
            }
            let body = json!({"error":{"message":"fake model: unknown path","type":"invalid_request_error"}});
            return Answer {
                response: json_response(404, &body),
                reset: false,
                summary: "404".into(),
                delay: no_delay,
            };
        }
        _ => {}
    }
    let (reply, delay) = decide(api, origin, body, prompts);
    let summary = describe(&reply);
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let model = body.get("model").and_then(Value::as_str).unwrap_or("fake-model");
    let response = match (&reply, api) {
        (Reply::Error { status, body, retry_after }, _) => {
            let mut response = match body {
                Value::String(page) => page_response(*status, page),
                _ => json_response(*status, body),
            };
            let headers = response.headers_mut();
            match retry_after {
                Some(seconds) => {
                    headers.insert("retry-after", HeaderValue::from(*seconds));
                }
                // Retryable errors ask for a quick retry, so CLIs that retry (Grok, OpenCode) give up fast.
                None if *status == 429 || *status >= 500 => {
                    headers.insert("retry-after-ms", HeaderValue::from_static("100"));
                    headers.insert("retry-after", HeaderValue::from_static("0"));
                }
                None => {}
            }
            response
        }
        (Reply::Reset, _) => json_response(500, &Value::Null),
        (_, Api::Responses) => sse_response(responses_events(&reply, context_tokens(body))),
        (_, _) if stream => sse_response(chat_events(&reply, model, context_tokens(body))),
        (_, _) => json_response(200, &chat_completion(&reply, model)),
    };
    Answer { response, reset: reply == Reply::Reset, summary, delay }
}

static IDS: AtomicU64 = AtomicU64::new(0);

fn next_id() -> u64 {
    IDS.fetch_add(1, Ordering::Relaxed) + 1
}

fn json_response(status: u16, body: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// An HTML page, or plain text.
fn page_response(status: u16, page: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(page.to_owned())));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let kind = if page.trim_start().starts_with('<') { "text/html" } else { "text/plain" };
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    response
}

fn sse_response(body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

const USAGE_IN: u64 = 10;
const USAGE_OUT: u64 = 5;

/// Chat-completions stream: role, content or tool-call deltas, finish reason, usage (`prompt_tokens` as given:
/// the body at about 4 bytes a token, so the context a CLI measures grows and shrinks with its requests and
/// Kimi compacts by itself once it nears a small `max_context_size`), `[DONE]`.
fn chat_events(reply: &Reply, model: &str, prompt_tokens: u64) -> String {
    let id = format!("chatcmpl-{}", next_id());
    let chunk = |delta: Value, finish: Value| {
        json!({"id":id,"object":"chat.completion.chunk","created":0,"model":model,
               "choices":[{"index":0,"delta":delta,"finish_reason":finish}]})
    };
    let mut events = vec![chunk(json!({"role":"assistant","content":""}), Value::Null)];
    let finish = match reply {
        Reply::Text(text) => {
            events.push(chunk(json!({"content":text}), Value::Null));
            "stop"
        }
        Reply::Calls(calls) => {
            for (index, call) in calls.iter().enumerate() {
                let call_id = format!("call_{}", next_id());
                events.push(chunk(
                    json!({"tool_calls":[{"index":index,"id":call_id,"type":"function","function":{"name":call.name,"arguments":""}}]}),
                    Value::Null,
                ));
                events.push(chunk(
                    json!({"tool_calls":[{"index":index,"function":{"arguments":call.arguments.to_string()}}]}),
                    Value::Null,
                ));
            }
            "tool_calls"
        }
        Reply::Error { .. } | Reply::Reset => "stop",
    };
    events.push(chunk(json!({}), json!(finish)));
    events.push(json!({"id":id,"object":"chat.completion.chunk","created":0,"model":model,"choices":[],
        "usage":{"prompt_tokens":prompt_tokens,"completion_tokens":USAGE_OUT,"total_tokens":prompt_tokens + USAGE_OUT}}));
    let mut out: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}

/// A non-streaming chat completion, for clients that do not ask for a stream.
fn chat_completion(reply: &Reply, model: &str) -> Value {
    let (message, finish) = match reply {
        Reply::Calls(calls) => {
            let tool_calls: Vec<Value> = calls
                .iter()
                .map(|c| json!({"id":format!("call_{}", next_id()),"type":"function","function":{"name":c.name,"arguments":c.arguments.to_string()}}))
                .collect();
            (json!({"role":"assistant","content":null,"tool_calls":tool_calls}), "tool_calls")
        }
        Reply::Text(text) => (json!({"role":"assistant","content":text}), "stop"),
        Reply::Error { .. } | Reply::Reset => (json!({"role":"assistant","content":""}), "stop"),
    };
    json!({"id":format!("chatcmpl-{}", next_id()),"object":"chat.completion","created":0,"model":model,
           "choices":[{"index":0,"message":message,"finish_reason":finish}],
           "usage":{"prompt_tokens":USAGE_IN,"completion_tokens":USAGE_OUT,"total_tokens":USAGE_IN + USAGE_OUT}})
}

/// The input tokens the Responses API reports for a request: its body at about 4 bytes a token, so that the
/// context a CLI measures grows with the conversation and shrinks when it compacts (Codex compacts by itself
/// when it passes `model_auto_compact_token_limit`).
pub(super) fn context_tokens(body: &Value) -> u64 {
    body.to_string().len() as u64 / 4
}

/// Responses API stream: `response.created`, one `output_item.done` per item, `response.completed` (usage:
/// `input_tokens` as given).
fn responses_events(reply: &Reply, input_tokens: u64) -> String {
    let response_id = format!("resp_{}", next_id());
    let mut events = vec![json!({"type":"response.created","response":{"id":response_id}})];
    match reply {
        Reply::Text(text) => {
            let item_id = format!("msg_{}", next_id());
            events.push(json!({"type":"response.output_item.added","output_index":0,
                "item":{"type":"message","role":"assistant","id":item_id,"content":[]}}));
            events.push(json!({"type":"response.output_text.delta","item_id":item_id,"output_index":0,"content_index":0,"delta":text}));
            events.push(json!({"type":"response.output_item.done","output_index":0,
                "item":{"type":"message","role":"assistant","id":item_id,"content":[{"type":"output_text","text":text}]}}));
        }
        Reply::Calls(calls) => {
            for (index, call) in calls.iter().enumerate() {
                let n = next_id();
                let mut item = json!({"type":"function_call","id":format!("fc_{n}"),"call_id":format!("call_{n}"),
                    "name":call.name,"arguments":call.arguments.to_string()});
                if let Some(ns) = &call.namespace {
                    item["namespace"] = json!(ns);
                }
                events.push(json!({"type":"response.output_item.done","output_index":index,"item":item}));
            }
        }
        Reply::Error { .. } | Reply::Reset => {}
    }
    events.push(json!({"type":"response.completed","response":{"id":response_id,
        "usage":{"input_tokens":input_tokens,"input_tokens_details":null,"output_tokens":USAGE_OUT,
                 "output_tokens_details":null,"total_tokens":input_tokens + USAGE_OUT}}}));
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e.get("type").and_then(Value::as_str).unwrap_or("message")))
        .collect()
}
