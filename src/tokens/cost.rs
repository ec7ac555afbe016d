//! [`TokenCost`]: the rule a vendor's requests are costed by, and how a
//! file says it.

/// How a vendor's requests cost tokens: estimated from the request, settled
/// from the usage in the answer. Give it to a vendor's route
/// ([`Route::tokens`](crate::route::Route::tokens)), or to every lane
/// ([`ShaperBuilder::tokens`](crate::shaper::ShaperBuilder::tokens)); in a
/// file, `tokens = "openai"` or
/// `tokens = { style = "anthropic", default_output = 1024 }`.
///
/// ```
/// use std::time::Duration;
/// use callshaper::{Quota, Shaper};
/// use callshaper::route::Route;
/// use callshaper::tokens::TokenCost;
///
/// let minute = Duration::from_secs(60);
/// let openai = Route::new("openai")
///     .host("api.openai.com")
///     .quota(Quota::leaky_bucket(500, minute))
///     .quota(Quota::sliding_log(90_000, minute).per_cost())
///     .tokens(TokenCost::openai())
///     .alone();
/// let shaper = Shaper::builder().route(openai).build()?;
/// # Ok::<(), callshaper::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCost {
    pub(super) style: Style,
    pub(super) default_output: u64,
    pub(super) include_usage: bool,
}

/// Whose JSON a vendor speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub(super) enum Style {
    /// OpenAI and the many vendors that copy its API.
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
}

/// The answer assumed for a request that names no longest answer: OpenAI's
/// limit is then the model's whole context, which would charge a
/// per-minute quota away in one request.
const DEFAULT_OUTPUT: u64 = 4_096;

impl TokenCost {
    /// OpenAI's chat completions, completions and Responses APIs, and
    /// vendors speaking them: `usage.total_tokens` settles, and a streaming
    /// request is asked for its usage (see [`include_usage`](Self::include_usage)).
    pub fn openai() -> Self {
        Self {
            style: Style::OpenAi,
            default_output: DEFAULT_OUTPUT,
            include_usage: true,
        }
    }

    /// Anthropic's Messages API: input, cache writes and output settle
    /// (cache reads do not count toward Anthropic's input limits); a stream
    /// reports them in its `message_start` and `message_delta` events.
    pub fn anthropic() -> Self {
        Self {
            style: Style::Anthropic,
            default_output: DEFAULT_OUTPUT,
            include_usage: false,
        }
    }

    /// The answer's tokens to charge for a request that names no limit on
    /// it (4,096 by default).
    pub fn default_output(mut self, tokens: u64) -> Self {
        self.default_output = tokens;
        self
    }

    /// Whether a streaming OpenAI-style request that does not say is asked
    /// for its usage (`stream_options.include_usage`; on by default for
    /// [`openai`](Self::openai)). Turn it off for a vendor that refuses the
    /// option: its streams then keep their estimate. Anthropic's streams
    /// report their usage unasked, so it is always off for
    /// [`anthropic`](Self::anthropic).
    pub fn include_usage(mut self, yes: bool) -> Self {
        self.include_usage = yes && self.style == Style::OpenAi;
        self
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for TokenCost {
    /// `"openai"`, or `{ style = "openai", default_output = 1024,
    /// include_usage = false }`.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            style: Style,
            default_output: Option<u64>,
            include_usage: Option<bool>,
        }
        #[derive(serde::Deserialize)]
        #[serde(
            untagged,
            expecting = "\"openai\", \"anthropic\", or a table with `style`"
        )]
        enum Said {
            Style(Style),
            Table(Table),
        }
        let (style, default_output, include_usage) = match Said::deserialize(deserializer)? {
            Said::Style(style) => (style, None, None),
            Said::Table(t) => (t.style, t.default_output, t.include_usage),
        };
        let mut cost = match style {
            Style::OpenAi => Self::openai(),
            Style::Anthropic => Self::anthropic(),
        };
        if let Some(tokens) = default_output {
            cost = cost.default_output(tokens);
        }
        if let Some(yes) = include_usage {
            cost = cost.include_usage(yes);
        }
        Ok(cost)
    }
}
