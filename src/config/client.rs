//! The file's `[client]` table: how long the client the file's shaper
//! sends through waits on a vendor.

use std::time::Duration;

use reqwest::ClientBuilder;
use serde::Deserialize;

use crate::error::ConfigError;
use crate::shaper::own_client;
use crate::time::human;

/// The timeouts of the client a file's shaper sends through, as the file
/// declares them (none by default, as reqwest's):
///
/// ```toml
/// [client]
/// connect_timeout = "10s"   # a connection to the vendor not made by then fails the attempt
/// read_timeout = "5m"       # the vendor silent this long, for its head or between two reads of its body
/// timeout = "10m"           # a whole attempt, its body's last byte included
/// ```
///
/// An attempt that times out is a transport error, retried as one. A
/// `read_timeout` shorter than the vendor's longest silence fails its
/// slowest answers (a long completion sends nothing until it is done);
/// `timeout` also ends a stream, however lively. Each is at least a
/// millisecond (a timer's tick: a shorter one fails every attempt) and at
/// most a day. A caller who adds a client (or a transport)
/// of their own sets its timeouts there: beside one, this table is an
/// error.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// See reqwest's `ClientBuilder::connect_timeout`.
    #[serde(default, with = "human::option")]
    pub connect_timeout: Option<Duration>,
    /// See reqwest's `ClientBuilder::read_timeout`.
    #[serde(default, with = "human::option")]
    pub read_timeout: Option<Duration>,
    /// See reqwest's `ClientBuilder::timeout`.
    #[serde(default, with = "human::option")]
    pub timeout: Option<Duration>,
}

/// The longest timeout a file may give: a timer adds it to the clock's
/// now.
const MOST: Duration = Duration::from_secs(86_400);
/// The shortest: a timer's tick.
const LEAST: Duration = Duration::from_millis(1);

impl ClientConfig {
    /// The client: as a shaper makes its own, with these timeouts.
    pub(super) fn client(&self) -> Result<reqwest::Client, ConfigError> {
        type Set = fn(ClientBuilder, Duration) -> ClientBuilder;
        let mut client = own_client();
        for (field, timeout, set) in [
            (
                "connect_timeout",
                self.connect_timeout,
                ClientBuilder::connect_timeout as Set,
            ),
            (
                "read_timeout",
                self.read_timeout,
                ClientBuilder::read_timeout,
            ),
            ("timeout", self.timeout, ClientBuilder::timeout),
        ] {
            let Some(timeout) = timeout else {
                continue;
            };
            if !(LEAST..=MOST).contains(&timeout) {
                return Err(ConfigError::new(
                    format!("client.{field}"),
                    format!("{timeout:?} is not between 1ms and 1d"),
                ));
            }
            client = set(client, timeout);
        }
        client
            .build()
            .map_err(|e| ConfigError::new("client", e.to_string()))
    }
}
