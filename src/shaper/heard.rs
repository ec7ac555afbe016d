//! What the vendor's answer said, read as a request's attempt comes back:
//! its headers in every dialect the shaper reads, a quota it announced,
//! what it means for the lane ([`throttle::classify`]), and a client that
//! followed a redirect by itself.

use std::sync::atomic::Ordering;

use reqwest::{Request, Response, Url};
use tokio::time::Instant;

use super::handle::Shaper;
use super::settle::Settle;
use crate::lane::Lane;
use crate::observability::shown_url;
use crate::signals::{AnswerClock, Signals, Spoken};
use crate::throttle::{self, Verdict};

impl Shaper {
    /// What the vendor said to a send of `cost` the lane charged at
    /// `charged_at`, and what it means (see [`throttle::classify`]). An
    /// answer carries what its headers said and how to settle its cost.
    pub(super) fn heard<E>(
        &self,
        lane: &Lane,
        outcome: &mut Result<Response, E>,
        cost: u64,
        charged_at: Instant,
        sent: Option<&Request>,
    ) -> Verdict {
        let Ok(response) = outcome else {
            return Verdict::Failed;
        };
        if let Some(sent) = sent
            && sent.url() != response.url()
        {
            self.followed_by_client(lane, sent.url(), response.url());
        }
        let signals = self.read_signals(response.headers());
        self.learn(lane, &signals);
        let answers = &lane.policy().answers;
        let verdict = throttle::classify(response.status(), &signals, answers);
        throttle::answered(lane, verdict, &signals, charged_at);
        // Moved, not cloned: what is done with the answer next reads them
        // there (`Signals::of`).
        let extensions = response.extensions_mut();
        extensions.insert(signals);
        extensions.insert(Settle::new(lane.clone(), cost, charged_at));
        verdict
    }

    /// The client the user gave followed a redirect by itself: its hops
    /// went on the wire without a turn, which the shaper cannot count
    /// (reqwest says neither how many there were nor where). Said once a
    /// shaper, with the lane and where the request went and landed (as
    /// the crate shows a URL: no query or credentials, which may carry a
    /// key), so the client is built again without.
    fn followed_by_client(&self, lane: &Lane, sent: &Url, landed: &Url) {
        if self.inner.warned_redirects.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            lane = %lane.name(),
            sent = shown_url(sent),
            landed = shown_url(landed),
            "the client followed a redirect by itself, so its hops went without a turn: \
             build it with redirect(reqwest::redirect::Policy::none()), and the shaper \
             follows redirects through the lanes"
        );
    }

    /// Every dialect this shaper reads: the built-in ones, then the user's.
    fn read_signals(&self, headers: &reqwest::header::HeaderMap) -> Signals {
        let spoken = Spoken::of(headers);
        if self.inner.dialects.is_empty() && spoken.is_none() {
            return Signals::default();
        }
        let read = || crate::signals::vendor_clock(headers, self.inner.wall.now());
        let clock = AnswerClock::new(&read);
        let mut signals = Signals::parse_spoken(headers, &clock, &spoken);
        for dialect in &self.inner.dialects {
            dialect.read(headers, clock.now(), &mut signals);
        }
        signals
    }

    /// A vendor announcing a lower quota than the lane's slows the lane.
    fn learn(&self, lane: &Lane, signals: &Signals) {
        if let Some(announced) = signals.announced_rate()
            && lane.learn(announced)
        {
            let policy = lane.policy();
            tracing::warn!(
                lane = %lane.name(),
                configured = ?lane.declared(),
                ?announced,
                "the vendor announced a lower quota than configured; the lane keeps to it"
            );
            if announced.interval(policy.headroom) > policy.max_pause {
                tracing::warn!(
                    lane = %lane.name(),
                    ?announced,
                    max_pause = ?policy.max_pause,
                    "the announced quota spaces requests further apart than max_pause; \
                     the lane keeps them max_pause apart"
                );
            }
        }
    }
}
