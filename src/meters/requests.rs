//! What a level's quotas say of requests alone ([`Requests`]): what a
//! vendor's numbers about requests are read against.

use super::quota::Quota;
use super::rate::Rate;

/// The request side of a level's quotas: the slowest quota counting
/// requests, the ceiling a learned quota or adaptive pacing is measured
/// against, and the smallest token bucket among them (see
/// `Window::allows`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Requests {
    pub(crate) rate: Option<Rate>,
    /// The smallest declared bucket's capacity (`NonZeroU64`: a bucket
    /// holds at least one, and the option costs no room).
    pub(crate) bucket: Option<std::num::NonZeroU64>,
}

impl Requests {
    pub(crate) fn of(quotas: &[Quota]) -> Self {
        let counting = || quotas.iter().filter(|q| q.counts_requests());
        Self {
            rate: counting().map(Quota::rate).min_by(|a, b| a.cmp_speed(b)),
            bucket: counting()
                .filter_map(Quota::bucket_capacity)
                .filter_map(std::num::NonZeroU64::new)
                .min(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Token quotas say nothing of requests; of the request quotas, the
    /// slowest is the rate and the smallest bucket the bucket, whichever
    /// quota each comes from.
    #[test]
    fn the_slowest_request_quota_and_the_smallest_bucket() {
        let (second, minute) = (Duration::from_secs(1), Duration::from_secs(60));
        let quotas = [
            Quota::token_bucket(20, 10, second),
            Quota::sliding_log(300, minute),
            Quota::token_bucket(5, 100, second),
            Quota::leaky_bucket(1, Duration::from_millis(1)).per_cost(),
        ];
        let requests = Requests::of(&quotas);
        assert_eq!(requests.rate, Some(Rate::new(300, minute)));
        assert_eq!(requests.bucket.map(std::num::NonZeroU64::get), Some(5));
        assert_eq!(Requests::of(&quotas[3..]), Requests::default());
    }
}
