//! What the crate shows of a request's URL, wherever it shows one (a
//! span, a log line, an error): no query, fragment or credentials, which
//! may carry an API key (`?key=…`, `https://user:token@…`).

use reqwest::Url;

/// `url` without its query, fragment and credentials.
pub(crate) fn shown_url(url: &Url) -> String {
    let mut url = url.clone();
    hide(&mut url);
    url.into()
}

/// A transport `error` as the crate passes it on: its URL as
/// [`shown_url`] shows one (reqwest's own errors print it whole).
pub(crate) fn shown_error(mut error: reqwest::Error) -> reqwest::Error {
    if let Some(url) = error.url_mut() {
        hide(url);
    }
    error
}

fn hide(url: &mut Url) {
    url.set_query(None);
    url.set_fragment(None);
    // Only URLs that cannot carry credentials refuse these, and those
    // have none to hide.
    let _ = url.set_password(None);
    let _ = url.set_username("");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_no_query_fragment_or_credentials() {
        let url = Url::parse("https://user:token@api.example/v1/a?key=AIza#top").unwrap();
        assert_eq!(shown_url(&url), "https://api.example/v1/a");
        let plain = Url::parse("http://127.0.0.1:9000/x").unwrap();
        assert_eq!(shown_url(&plain), "http://127.0.0.1:9000/x");
    }
}
