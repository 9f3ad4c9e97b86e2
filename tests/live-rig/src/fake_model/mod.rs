//! A scripted fake model server for the live tests.
//!
//! Serves on 127.0.0.1 (OS-chosen port) the streaming APIs the CLIs call: OpenAI chat completions with SSE
//! (Kimi, Grok, OpenCode, Qwen Code), the OpenAI Responses API with SSE (Codex), Gemini's
//! `POST /v1beta/models/<model>:streamGenerateContent?alt=sse` with `data:` lines only (Gemini CLI, through
//! `GOOGLE_GEMINI_BASE_URL`) and Anthropic's Messages API `POST /v1/messages` with SSE events (Claude Agent ACP,
//! through `ANTHROPIC_BASE_URL`), and both token-count endpoints. Any model name and any API key are accepted.
//! Every request is recorded. Errors come in each API's own shape: Google's `{error: {code, message, status,
//! details}}` (a `429-usage` names a per-day `quotaId`), Anthropic's `{type: "error", error: {type, message}}`.
//!
//! What the "model" answers is chosen by markers in the latest user text of the request:
//!
//! | marker | answer |
//! | --- | --- |
//! | (none) | plain text |
//! | `[[text:T]]` | plain text `T` (also the closing text after a tool result) |
//! | `[[bg:CMD]]` | a background shell tool call running `CMD` |
//! | `[[sh:CMD]]` | a foreground shell tool call running `CMD` |
//! | `[[subagent:PROMPT]]`, `[[subagent:NAME\|PROMPT]]` | a subagent spawn (background where the CLI offers the choice) |
//! | `[[subagent-fg:PROMPT]]` | a foreground subagent spawn |
//! | `[[resume:ID\|PROMPT]]` | a follow-up to subagent `ID` (`last`: the latest id a tool result named) |
//! | `[[tool:NAME\|JSON]]` | a call of any tool the request offers, with these arguments; `$last_task` in JSON becomes the latest `task_id: X` a tool result named (Kimi's TaskStop, WaitFor) |
//! | `[[error:KIND]]` | an HTTP error: `429-usage`, `429-rate`, `500`, `502` (a proxy's HTML page), `503`, `503-text` (a 503 with a line of plain text, no error object), `529` (overloaded), `401`, or `reset` (the connection closed without an answer); `KIND~S` answers with `Retry-After: S` (seconds) instead of the quick retry; `KIND*N` fails only the first N attempts |
//! | `[[delay:MS]]` | wait `MS` milliseconds before answering (combine with any other marker) |
//! | `[[review:OUTCOME\|RISK\|RATIONALE]]` | the verdict Codex's approval reviewer gets (`allow` or `deny`, `low`…`critical`; see `review`); other requests ignore it |
//! | (a request for a summary of the conversation so far: Grok's compaction) | a numbered summary ([`COMPACTION_SUMMARY`]) |
//!
//! Several tool markers in one prompt become parallel tool calls. Markers may nest, so a subagent's
//! prompt can carry its own markers: `[[subagent:[[bg:sleep 2]]]]`. When the request ends with a tool
//! result the model answers plain text, so every turn ends. Title and summary side requests get a
//! short title (as the forced tool call or JSON object when the request asks for one). A marker whose
//! tool the request does not offer is answered with a plain text saying so, never with a call of a
//! tool the CLI does not have. Retryable errors carry `retry-after-ms: 100` so CLIs that honour it
//! (OpenCode) give up quickly (unless `~S` asks for a real wait); Grok ignores it and retries 5xx fifteen times
//! with backoff.
//!
//! Kimi joins the prompts of failed turns into one user message; prompts seen before are dropped from
//! its start, so only the newest prompt's markers count.
//!
//! Split by job: `server` (HTTP, the running server), `record` (the requests it received), `request` (each
//! API's request read as one conversation, the tools it offers), `markers`, `origin` (main, subagent or side
//! request), `review` (Codex's approval reviewer), `script` (the scripted answer), `wire` (each API's answer
//! format). Each CLI's tool names and title phrases are in [`crate::cli`].

mod markers;
mod origin;
mod record;
mod request;
mod review;
mod script;
mod server;
mod wire;

pub use origin::Origin;
pub use record::{RecordedRequest, summary_line};
pub use request::Api;
pub use script::{AFTER_TOOL_TEXT, COMPACTION_SUMMARY, DEFAULT_TEXT, SIDE_TEXT};
pub use server::{FakeModel, Options};
