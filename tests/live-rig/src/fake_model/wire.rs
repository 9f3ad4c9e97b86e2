//! Each API's answer on the wire: the HTTP response for a scripted reply, and the model list.
//!
//! Chat completions as SSE or JSON, the Responses API as SSE, Gemini's `generateContent` as SSE (`data:` lines
//! only, as its client parses them) or JSON, Anthropic's Messages API as SSE events or JSON, token counts, errors
//! with their retry headers.

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
    path: &str,
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
        Api::CountTokens => {
            // Gemini reads `totalTokens`, Anthropic `input_tokens`; each ignores the other's key.
            let n = context_tokens(body);
            return Answer {
                response: json_response(200, &json!({"totalTokens": n, "input_tokens": n})),
                reset: false,
                summary: "token count".into(),
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
        (_, Api::Gemini) if path.ends_with(":streamGenerateContent") => {
            sse_response(gemini_events(&reply, context_tokens(body)))
        }
        (_, Api::Gemini) => json_response(200, &gemini_chunk(&reply, context_tokens(body), true)),
        (_, Api::Anthropic) if stream => sse_response(anthropic_events(&reply, model, context_tokens(body))),
        (_, Api::Anthropic) => json_response(200, &anthropic_message(&reply, model, context_tokens(body))),
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

/// One `GenerateContentResponse`: the reply's parts, and when `last` the finish reason and usage.
fn gemini_chunk(reply: &Reply, prompt_tokens: u64, last: bool) -> Value {
    let parts: Vec<Value> = match reply {
        Reply::Text(text) => vec![json!({"text": text})],
        Reply::Calls(calls) => {
            calls.iter().map(|c| json!({"functionCall": {"name": c.name, "args": c.arguments}})).collect()
        }
        Reply::Error { .. } | Reply::Reset => vec![json!({"text": ""})],
    };
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    let mut chunk = json!({"modelVersion": "fake-model", "responseId": format!("resp-{}", next_id())});
    if last {
        candidate["finishReason"] = json!("STOP");
        chunk["usageMetadata"] = json!({"promptTokenCount": prompt_tokens, "candidatesTokenCount": USAGE_OUT,
            "totalTokenCount": prompt_tokens + USAGE_OUT});
    }
    chunk["candidates"] = json!([candidate]);
    chunk
}

/// Gemini's stream: the whole reply in one chunk that also finishes it, as `data:` lines.
fn gemini_events(reply: &Reply, prompt_tokens: u64) -> String {
    format!("data: {}\n\n", gemini_chunk(reply, prompt_tokens, true))
}

/// The content blocks of an Anthropic message for a reply.
fn anthropic_blocks(reply: &Reply) -> (Vec<Value>, &'static str) {
    match reply {
        Reply::Calls(calls) => (
            calls
                .iter()
                .map(|c| json!({"type": "tool_use", "id": format!("toolu_{}", next_id()), "name": c.name, "input": c.arguments}))
                .collect(),
            "tool_use",
        ),
        Reply::Text(text) => (vec![json!({"type": "text", "text": text})], "end_turn"),
        Reply::Error { .. } | Reply::Reset => (vec![json!({"type": "text", "text": ""})], "end_turn"),
    }
}

fn anthropic_usage(input_tokens: u64, output_tokens: u64) -> Value {
    json!({"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0})
}

/// A non-streamed Anthropic message.
fn anthropic_message(reply: &Reply, model: &str, input_tokens: u64) -> Value {
    let (content, stop) = anthropic_blocks(reply);
    json!({"id": format!("msg_{}", next_id()), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop, "stop_sequence": null, "usage": anthropic_usage(input_tokens, USAGE_OUT)})
}

/// Anthropic's stream: `message_start`, each block's start, delta and stop, `message_delta` (stop reason, output
/// usage), `message_stop`; each an `event:` line and a `data:` line.
fn anthropic_events(reply: &Reply, model: &str, input_tokens: u64) -> String {
    let (content, stop) = anthropic_blocks(reply);
    let mut events = vec![json!({"type": "message_start", "message": {"id": format!("msg_{}", next_id()),
        "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": anthropic_usage(input_tokens, 1)}})];
    for (index, block) in content.iter().enumerate() {
        let (start, delta) = match block.get("type").and_then(Value::as_str) {
            Some("tool_use") => {
                let mut start = block.clone();
                start["input"] = json!({});
                let partial = block.get("input").map(Value::to_string).unwrap_or_default();
                (start, json!({"type": "input_json_delta", "partial_json": partial}))
            }
            _ => (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": block.get("text").cloned().unwrap_or_default()}),
            ),
        };
        events.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        events.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
        events.push(json!({"type": "content_block_stop", "index": index}));
    }
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
        "usage": {"output_tokens": USAGE_OUT}}));
    events.push(json!({"type": "message_stop"}));
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e.get("type").and_then(Value::as_str).unwrap_or("message")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_model::origin::classify_origin;
    use crate::fake_model::request::classify_api;

    fn body_text(response: Response<Full<Bytes>>) -> String {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let bytes = rt.block_on(response.into_body().collect()).expect("body").to_bytes();
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    fn ask(path: &str, body: &Value) -> (u16, String) {
        let api = classify_api(&Method::POST, path);
        let answer = answer(api, classify_origin(api, body), &Method::POST, path, body, &mut HashMap::new());
        let status = answer.response.status().as_u16();
        (status, body_text(answer.response))
    }

    /// The JSON of each `data:` line.
    fn data_lines(text: &str) -> Vec<Value> {
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).expect("JSON")).collect()
    }

    const GEMINI: &str = "/v1beta/models/fake-model:streamGenerateContent";

    #[test]
    fn gemini_streams_data_lines_only_and_calls_the_shell_tool_it_declares() {
        let tools = json!([{"functionDeclarations": [{"name": "run_shell_command",
            "parametersJsonSchema": {"type": "object", "properties": {"command": {}, "is_background": {}}}}]}]);
        let body = json!({"contents": [{"role": "user", "parts": [{"text": "<session_context>x</session_context>"},
            {"text": "go [[sh:echo hi]]"}]}], "tools": tools});
        let (status, text) = ask(GEMINI, &body);
        assert_eq!(status, 200);
        assert!(text.lines().all(|l| l.is_empty() || l.starts_with("data: ")), "{text}");
        let chunks = data_lines(&text);
        let part = &chunks[0]["candidates"][0]["content"]["parts"][0];
        assert_eq!(part["functionCall"], json!({"name": "run_shell_command", "args": {"command": "echo hi"}}));
        assert_eq!(chunks[0]["candidates"][0]["finishReason"], "STOP");
        // The tool's answer: the closing text.
        let mut after = body.clone();
        after["contents"].as_array_mut().expect("contents").extend([
            json!({"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {}}}]}),
            json!({"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command",
                "response": {"output": "hi"}}}]}),
        ]);
        let chunks = data_lines(&ask(GEMINI, &after).1);
        assert_eq!(chunks[0]["candidates"][0]["content"]["parts"][0]["text"], crate::fake_model::AFTER_TOOL_TEXT);
    }

    #[test]
    fn gemini_errors_carry_googles_status_and_a_daily_quota_id() {
        let body = json!({"contents": [{"role": "user", "parts": [{"text": "[[error:429-usage]]"}]}],
            "tools": [{"functionDeclarations": [{"name": "x"}]}]});
        let (status, text) = ask(GEMINI, &body);
        assert_eq!(status, 429);
        let error: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(error["error"]["status"], "RESOURCE_EXHAUSTED");
        assert!(
            error["error"]["details"][0]["violations"][0]["quotaId"].as_str().is_some_and(|q| q.contains("PerDay"))
        );
        let body = json!({"contents": [{"role": "user", "parts": [{"text": "[[error:503~1]]"}]}],
            "tools": [{"functionDeclarations": [{"name": "x"}]}]});
        assert_eq!(ask(GEMINI, &body).0, 503);
    }

    #[test]
    fn anthropic_streams_events_with_a_tool_use_block_and_its_input_as_json_deltas() {
        let tools = json!([{"name": "Bash", "input_schema": {"type": "object",
            "properties": {"command": {}, "run_in_background": {}, "description": {}}}}]);
        let body = json!({"model": "fake-model", "stream": true, "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>r</system-reminder>"},
                {"type": "text", "text": "run [[bg:sleep 1]]"}]}], "tools": tools});
        let (status, text) = ask("/v1/messages", &body);
        assert_eq!(status, 200);
        let events: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
        assert_eq!(
            events,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let data = data_lines(&text);
        assert_eq!(data[1]["content_block"]["type"], "tool_use");
        assert_eq!(data[1]["content_block"]["name"], "Bash");
        let input: Value =
            serde_json::from_str(data[2]["delta"]["partial_json"].as_str().expect("partial json")).expect("JSON");
        assert_eq!(input, json!({"command": "sleep 1", "description": "run sleep 1", "run_in_background": true}));
        assert_eq!(data[4]["delta"]["stop_reason"], "tool_use");
        // After the tool result: text, `end_turn`.
        let mut after = body.clone();
        after["messages"].as_array_mut().expect("messages").extend([
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "done"}]}),
        ]);
        let data = data_lines(&ask("/v1/messages", &after).1);
        assert_eq!(data[2]["delta"]["text"], crate::fake_model::AFTER_TOOL_TEXT);
        assert_eq!(data[4]["delta"]["stop_reason"], "end_turn");
    }

    #[test]
    fn anthropic_errors_and_token_counts_have_anthropics_shape() {
        let body = json!({"messages": [{"role": "user", "content": "[[error:529]]"}], "tools": [{"name": "x"}]});
        let (status, text) = ask("/v1/messages", &body);
        assert_eq!(status, 529);
        assert_eq!(serde_json::from_str::<Value>(&text).expect("JSON")["error"]["type"], "overloaded_error");
        let body = json!({"messages": [{"role": "user", "content": "[[error:429-rate]]"}], "tools": [{"name": "x"}]});
        let (status, text) = ask("/v1/messages", &body);
        assert_eq!(status, 429);
        assert_eq!(serde_json::from_str::<Value>(&text).expect("JSON")["error"]["type"], "rate_limit_error");
        let (status, text) = ask("/v1/messages/count_tokens", &json!({"messages": []}));
        assert_eq!(status, 200);
        assert!(serde_json::from_str::<Value>(&text).expect("JSON")["input_tokens"].is_u64());
    }
}
