//! [`Answers`]: what a vendor's statuses and bodies mean, per vendor.

use reqwest::StatusCode;

use crate::error::ConfigError;

/// What a vendor's answers mean, per vendor: which statuses throttle the
/// lane, which say the vendor is overloaded, which fail one request, and
/// which bodies say no pause helps. Everything else is final.
///
/// The defaults fit the vendors callshaper knows (see `throttle.rs`, which
/// applies them): 429 throttles; 503 and 529 (Anthropic's "overloaded")
/// pause the lane without teaching it a quota; 500, 502, 504 and 408 fail
/// one request, which may go again; a 429 or 402 whose body carries
/// OpenAI's `insufficient_quota` or `billing_hard_limit_reached` ends the
/// vendor's requests at once. A vendor that answers differently (Twitter's
/// old 420, a 503 that only means "try elsewhere") gets its own.
///
/// nginx's `limit_req` refuses with a headerless **503** unless
/// `limit_req_status` says otherwise: by its bytes alone that is an
/// overload, so the lane would pause and learn nothing. Behind nginx, mark
/// it a throttle, and the lane learns nginx's spacing from it:
///
/// ```
/// use callshaper::Answers;
/// use reqwest::StatusCode;
/// let behind_nginx = Answers::default().throttle(StatusCode::SERVICE_UNAVAILABLE);
/// assert!(!behind_nginx.is_overload(StatusCode::SERVICE_UNAVAILABLE));
/// ```
///
/// In a file: `answers = { throttles = [429, 503], overloads = [529] }`.
///
/// ```
/// use callshaper::Answers;
/// use reqwest::StatusCode;
/// // A vendor that throttles with 420 and whose 503 is an outage of one
/// // request, not an overload worth pausing for.
/// let answers = Answers::default()
///     .throttle(StatusCode::from_u16(420).unwrap())
///     .failure(StatusCode::SERVICE_UNAVAILABLE);
/// assert!(answers.is_throttle(StatusCode::from_u16(420).unwrap()));
/// assert!(!answers.is_throttle(StatusCode::SERVICE_UNAVAILABLE));
/// ```
///
/// In a file (feature `config`), each list left out keeps its default:
///
/// ```toml
/// answers = { throttles = [429, 420], failures = [500, 502, 503, 504, 408] }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct Answers {
    /// The lane is too fast: pause it (the vendor's hint, else the
    /// fallback) and learn the quota the vendor really allows.
    throttles: Vec<u16>,
    /// The vendor is overloaded: pause the lane, learn no quota.
    overloads: Vec<u16>,
    /// This request failed: it may go again after a backoff.
    failures: Vec<u16>,
    /// Text in the body of a throttle (or a 402) that says the account is
    /// out of credit: no pause helps, so requests end at once.
    out_of_credit: Vec<String>,
}

impl Default for Answers {
    fn default() -> Self {
        Self {
            throttles: vec![429],
            overloads: vec![503, 529],
            failures: vec![500, 502, 504, 408],
            out_of_credit: vec![
                "insufficient_quota".to_owned(),
                "billing_hard_limit_reached".to_owned(),
            ],
        }
    }
}

impl Answers {
    /// `status` throttles the lane (and no longer means anything else).
    #[must_use]
    pub fn throttle(mut self, status: StatusCode) -> Self {
        self.forget(status);
        self.throttles.push(status.as_u16());
        self
    }

    /// `status` says the vendor is overloaded: the lane pauses but learns
    /// no quota from it.
    #[must_use]
    pub fn overload(mut self, status: StatusCode) -> Self {
        self.forget(status);
        self.overloads.push(status.as_u16());
        self
    }

    /// `status` fails one request, which may go again.
    #[must_use]
    pub fn failure(mut self, status: StatusCode) -> Self {
        self.forget(status);
        self.failures.push(status.as_u16());
        self
    }

    /// `status` is a final answer: handed to the caller as it is.
    #[must_use]
    pub fn final_answer(mut self, status: StatusCode) -> Self {
        self.forget(status);
        self
    }

    /// A throttle (or a 402) whose body contains `marker` says the account
    /// is out of credit.
    #[must_use]
    pub fn out_of_credit(mut self, marker: impl Into<String>) -> Self {
        self.out_of_credit.push(marker.into());
        self
    }

    /// No body means out of credit: every throttle pauses and goes again.
    #[must_use]
    pub fn never_out_of_credit(mut self) -> Self {
        self.out_of_credit.clear();
        self
    }

    fn forget(&mut self, status: StatusCode) {
        let code = status.as_u16();
        for list in [&mut self.throttles, &mut self.overloads, &mut self.failures] {
            list.retain(|&c| c != code);
        }
    }

    /// True when `status` pauses the lane (a throttle or an overload).
    pub fn is_throttle(&self, status: StatusCode) -> bool {
        let code = status.as_u16();
        self.throttles.contains(&code) || self.overloads.contains(&code)
    }

    /// True when `status` says the vendor is overloaded.
    pub fn is_overload(&self, status: StatusCode) -> bool {
        self.overloads.contains(&status.as_u16())
    }

    /// True when `status` fails one request.
    pub fn is_failure(&self, status: StatusCode) -> bool {
        self.failures.contains(&status.as_u16())
    }

    /// Whether the body of an answer of `status` is read for an
    /// out-of-credit marker before the request goes again.
    pub(crate) fn may_be_out_of_credit(&self, status: StatusCode) -> bool {
        !self.out_of_credit.is_empty()
            && (self.is_throttle(status) && !self.is_overload(status)
                || status == StatusCode::PAYMENT_REQUIRED)
    }

    /// True when `body` carries an out-of-credit marker.
    pub(crate) fn says_out_of_credit(&self, body: &str) -> bool {
        self.out_of_credit
            .iter()
            .any(|marker| !marker.is_empty() && body.contains(marker.as_str()))
    }

    /// Each status a valid HTTP status, in one list at most; no empty
    /// marker (it would match every body).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let lists = [
            ("throttles", &self.throttles),
            ("overloads", &self.overloads),
            ("failures", &self.failures),
        ];
        for (i, (name, list)) in lists.iter().enumerate() {
            for &code in list.iter() {
                if !(100..=599).contains(&code) {
                    return Err(ConfigError::new(
                        format!("answers.{name}"),
                        format!("{code} is not an HTTP status (100 to 599)"),
                    ));
                }
                if let Some((other, _)) = lists[i + 1..].iter().find(|(_, l)| l.contains(&code)) {
                    return Err(ConfigError::new(
                        format!("answers.{name}"),
                        format!("{code} is in `{other}` too: a status means one thing"),
                    ));
                }
            }
        }
        if self.out_of_credit.iter().any(String::is_empty) {
            return Err(ConfigError::new(
                "answers.out_of_credit",
                "an empty marker would say every body is out of credit",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    #[test]
    fn the_defaults_are_the_known_vendors() {
        let answers = Answers::default();
        assert!(answers.is_throttle(status(429)));
        assert!(answers.is_throttle(status(529)) && answers.is_overload(status(529)));
        assert!(answers.is_failure(status(502)));
        assert!(!answers.is_throttle(status(403)) && !answers.is_failure(status(404)));
        assert!(answers.may_be_out_of_credit(status(429)));
        assert!(answers.may_be_out_of_credit(status(402)));
        assert!(!answers.may_be_out_of_credit(status(503)));
        assert!(answers.says_out_of_credit(r#"{"error":{"code":"insufficient_quota"}}"#));
        assert!(answers.validate().is_ok());
    }

    #[test]
    fn a_status_means_one_thing() {
        let answers = Answers::default()
            .throttle(status(503))
            .failure(status(429))
            .final_answer(status(500));
        assert!(answers.is_throttle(status(503)) && !answers.is_overload(status(503)));
        assert!(answers.is_failure(status(429)) && !answers.is_throttle(status(429)));
        assert!(!answers.is_failure(status(500)));
        assert!(answers.validate().is_ok());
        let none = Answers::default().never_out_of_credit();
        assert!(!none.may_be_out_of_credit(status(429)));
    }

    #[test]
    fn hostile_lists_are_refused() {
        let twice = Answers {
            failures: vec![429],
            ..Answers::default()
        };
        let error = twice.validate().unwrap_err().to_string();
        assert!(error.contains("429 is in `failures` too"), "{error}");
        let bogus = Answers {
            throttles: vec![0, 429],
            ..Answers::default()
        };
        assert!(
            bogus
                .validate()
                .unwrap_err()
                .to_string()
                .contains("0 is not")
        );
        let huge = Answers {
            overloads: vec![u16::MAX],
            ..Answers::default()
        };
        assert!(huge.validate().is_err());
        let empty = Answers::default().out_of_credit("");
        assert!(empty.validate().is_err());
    }
}
