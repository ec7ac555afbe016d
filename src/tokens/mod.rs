//! What an LLM call costs in tokens (feature `tokens`): estimated from the
//! request before it goes, settled from the usage its answer reports.
//!
//! A tokens-per-minute quota ([`Quota::per_cost`](crate::Quota::per_cost))
//! must be charged before the vendor answers, when nobody knows the cost
//! yet. Anthropic does the same: it charges `max_tokens` when a request
//! starts and corrects the charge to the output really used when it ends.
//! A [`TokenCost`] on a vendor does both on the client:
//!
//! - **Before:** the request's JSON body is read for its prompt (every
//!   string in it, a token per 4 ASCII characters and one per other
//!   character, so code and CJK text are not underestimated) and its
//!   longest answer (`max_tokens`, `max_completion_tokens` or
//!   `max_output_tokens`, times `n` choices; [`TokenCost::default_output`]
//!   when it names none). Their sum is the request's cost, unless the
//!   caller gave one ([`RequestBuilder::cost`](crate::shaper::RequestBuilder::cost)).
//! - **After:** the answer's `usage` (in the JSON body, or in the
//!   server-sent events of a stream: OpenAI's last chunk, Anthropic's
//!   `message_start` and `message_delta`, the Responses API's
//!   `response.completed`) settles the charge up or down, as
//!   [`Settle::report`](crate::shaper::Settle::report) does, when the body
//!   ends. A body read only in part, or an answer without usage, keeps the
//!   estimate: the charge is never lowered on a guess.
//!
//! OpenAI streams its usage only when asked (`stream_options.include_usage`).
//! [`TokenCost::openai`] asks for it in a streaming chat or completions
//! request that does not say, and takes the usage-only chunk it adds out of
//! the stream again, so the caller sees the events it asked for.
//!
//! | file | what it owns |
//! |---|---|
//! | `cost.rs` | [`TokenCost`]: the rule a vendor's requests are costed by |
//! | `request.rs` | reading a request body: the estimate, and asking for usage |
//! | `usage.rs` | reading `usage` objects, however a vendor spells and spreads them |
//! | `events.rs` | server-sent events, scanned for usage as they pass |

mod cost;
mod events;
mod request;
mod usage;

pub use self::cost::TokenCost;
pub(crate) use self::events::Events;
pub(crate) use self::request::Prepared;
pub(crate) use self::usage::Json;
