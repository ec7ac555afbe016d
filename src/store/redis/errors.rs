//! What Redis's errors mean to a lane: a timeout, a TLS failure, refused
//! credentials, a permission the store's ACL user lacks, or any other
//! failure ([`StoreError`]).

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::error::StoreError;

/// The [`StoreError`] a Redis error is.
pub(super) fn failed(error: RedisError) -> StoreError {
    let text = error.to_string();
    if let Some(command) = refused_command(&error, &text) {
        return StoreError::NotPermitted {
            command,
            message: text,
        };
    }
    if is_tls(&text) {
        return StoreError::Tls(text);
    }
    if error.kind() == ErrorKind::AuthenticationFailed
        || ["NOAUTH", "WRONGPASS"]
            .iter()
            .any(|code| text.contains(code))
    {
        return StoreError::Auth(text);
    }
    StoreError::Failed(text)
}

/// The answer to a call bounded by `timeout`.
pub(super) async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    answered(timeout, tokio::time::timeout(timeout, call).await)
}

pub(super) fn answered<T>(
    timeout: Duration,
    answer: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
) -> Result<T, StoreError> {
    // The connection's own response timeout (the same length) often fires
    // first: a timeout either way.
    match answer {
        Ok(Err(error)) if error.is_timeout() => Err(StoreError::Timeout(timeout)),
        Ok(answer) => answer.map_err(failed),
        Err(_) => Err(StoreError::Timeout(timeout)),
    }
}

/// The command an ACL refused, when `error` is a `NOPERM`: from a command
/// of ours, or from one a script ran (Redis reports those inside the
/// script's error).
fn refused_command(error: &RedisError, text: &str) -> Option<String> {
    let noperm = error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || text.contains("NOPERM")
        || text.contains("no permissions")
        || text.contains("can't run this command");
    if !noperm {
        return None;
    }
    // "User fleet has no permissions to run the 'evalsha' command"; a key
    // or channel refused names no command, nor does a command a script
    // ran ("The user executing the script can't run this command"), which
    // the check at connect names unless the ACL changed since.
    let named = text
        .split_once("to run the '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(command, _)| command.to_owned());
    Some(named.unwrap_or_else(|| {
        if text.contains("script") {
            "a command the fleet's scripts run".to_owned()
        } else if text.contains("channel") {
            "subscribe".to_owned()
        } else {
            "a key outside the user's key pattern".to_owned()
        }
    }))
}

/// What rustls and redis-rs's TLS set-up say when they refuse: an
/// untrusted or mismatched certificate, an alert from the server (a client
/// certificate it wanted), PEM that does not parse.
const TLS_MARKERS: &[&str] = &[
    "invalid peer certificate",
    "received fatal alert",
    "peer sent no certificates",
    "peer is incompatible",
    "peer misbehaved",
    "certificate PEM",
    "private key from PEM",
    "with TLS parameters",
    "No crypto provider",
    "`rediss://` scheme",
];

/// True when the handshake or the TLS set-up failed. By the message:
/// redis-rs keeps the I/O error behind an `Arc` whose sources skip the
/// rustls error inside, so no downcast reaches it.
fn is_tls(text: &str) -> bool {
    TLS_MARKERS.iter().any(|marker| text.contains(marker))
}
