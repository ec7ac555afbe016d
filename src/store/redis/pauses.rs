//! The pause channel: every instance subscribes, and a pause one instance
//! publishes reaches the local gates of its key in all of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::oneshot;

use super::errors::within;
use crate::error::StoreError;
use crate::gate::{Gate, PauseCause};
use crate::sync::lock;

/// Where the pause channel is subscribed: any of the listed nodes (one
/// node, or a cluster's, where `PUBLISH` reaches every node), or the master
/// the sentinels name now.
pub(super) enum Nodes {
    Listed(Vec<redis::Client>),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(Arc<super::sentinel::Followed>),
}

impl Nodes {
    fn len(&self) -> usize {
        match self {
            Self::Listed(nodes) => nodes.len(),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(_) => 1,
        }
    }

    /// The node of the `attempt`th subscription.
    async fn pick(&self, attempt: usize) -> redis::RedisResult<redis::Client> {
        match self {
            Self::Listed(nodes) => nodes
                .get(attempt % nodes.len().max(1))
                .cloned()
                .ok_or_else(|| (redis::ErrorKind::InvalidClientConfig, "no node").into()),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(followed) => followed.master_client().await,
        }
    }
}

/// Subscribe to the pause channel on one of `nodes` and apply every pause
/// to the local gates of its key; when the connection drops, subscribe again
/// on the next node, until the store goes.
pub(super) async fn listen(
    nodes: Nodes,
    channel: String,
    gates: Arc<Registry>,
    mut stop: oneshot::Receiver<()>,
    ready: oneshot::Sender<Result<(), StoreError>>,
) {
    let mut ready = Some(ready);
    let mut failed_in_a_row = 0;
    for attempt in 0.. {
        // A host that does not answer must not hold the listener forever.
        let subscribed = within(Duration::from_secs(5), async {
            let client = nodes.pick(attempt).await?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            redis::RedisResult::Ok(pubsub)
        });
        let pubsub = tokio::select! {
            _ = &mut stop => return,
            subscribed = subscribed => subscribed,
        };
        match pubsub {
            Ok(mut pubsub) => {
                failed_in_a_row = 0;
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Ok(()));
                }
                let mut messages = pubsub.on_message();
                loop {
                    tokio::select! {
                        _ = &mut stop => return,
                        message = messages.next() => match message {
                            Some(message) => apply_pause(&gates, message.get_payload_bytes()),
                            None => break,
                        },
                    }
                }
            }
            Err(error) => {
                failed_in_a_row += 1;
                // At startup, every node gets one try before the store
                // reports the failure.
                if failed_in_a_row >= nodes.len()
                    && let Some(ready) = ready.take()
                {
                    let _ = ready.send(Err(error));
                    return;
                }
            }
        }
        if ready.is_some() {
            continue;
        }
        // Lost: pauses published meanwhile still reach this instance with
        // its next reservation, which starts after them.
        tokio::select! {
            _ = &mut stop => return,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// A pause message: `key\nmicroseconds left`.
pub(super) fn apply_pause(gates: &Registry, payload: &[u8]) {
    let Ok(text) = std::str::from_utf8(payload) else {
        return;
    };
    let Some((key, left)) = text.rsplit_once('\n') else {
        return;
    };
    let Ok(left) = left.parse::<u64>() else {
        return;
    };
    let local: Vec<Arc<Gate>> = lock(gates)
        .get(key)
        .map(|gates| gates.iter().filter_map(Weak::upgrade).collect())
        .unwrap_or_default();
    for gate in local {
        gate.pause_for(Duration::from_micros(left), PauseCause::Fleet, None);
    }
}

/// Local gates by key: several shapers of one process may share a store,
/// each with its own gate for a key.
pub(super) type Registry = Mutex<HashMap<String, Vec<Weak<Gate>>>>;
