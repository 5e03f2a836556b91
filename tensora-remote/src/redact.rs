//! The one place secrets are taken out of text: passwords in URLs (`http://user:password@host/`)
//! and every query-string value (`X-Amz-Signature`, `sig`, `token`, presigned URLs: a query value
//! is treated as a secret whatever its name). Every URL this crate prints goes through
//! `redact_url`, and every message that comes from elsewhere (the HTTP client's errors, the
//! input of a bad location) through [`redact`], so no error, report, `Debug` output or finding
//! carries a credential.

use url::Url;

/// What a redacted secret is replaced with.
pub const REDACTED: &str = "***";

/// `url` as printable text: its password (or a user name given without one, which is then a
/// token) and every query value replaced by [`REDACTED`].
pub fn redact_url(url: &Url) -> String {
    redact(url.as_str())
}

/// `text` with every URL in it redacted as `redact_url` does. A URL is found by its `://` and
/// ends at whitespace or a quote; text without `://` comes back unchanged.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        let end = after
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>'))
            .unwrap_or(after.len());
        let (url_tail, next) = after.split_at(end);
        out.push_str(&redact_url_tail(url_tail));
        rest = next;
    }
    out.push_str(rest);
    out
}

/// Redacts what follows `scheme://`: the userinfo of the authority, then each query value.
fn redact_url_tail(tail: &str) -> String {
    let (authority, path_and_more) = tail.split_at(authority_len(tail));
    let mut out = String::with_capacity(tail.len());
    match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = authority.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _password)) => {
                    out.push_str(user);
                    out.push(':');
                    out.push_str(REDACTED);
                }
                // A lone user name in a URL is usually a token (`https://TOKEN@host/`).
                None => out.push_str(REDACTED),
            }
            out.push_str(host);
        }
        None => out.push_str(authority),
    }
    let (path, query_and_fragment) = match path_and_more.find('?') {
        Some(q) => path_and_more.split_at(q),
        None => (path_and_more, ""),
    };
    out.push_str(path);
    if let Some(query) = query_and_fragment.strip_prefix('?') {
        let (query, fragment) = match query.find('#') {
            Some(h) => query.split_at(h),
            None => (query, ""),
        };
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((key, value)) if !value.is_empty() => {
                    out.push_str(key);
                    out.push('=');
                    out.push_str(REDACTED);
                }
                _ => out.push_str(pair),
            }
        }
        out.push_str(fragment);
    }
    out
}

/// The length of the authority at the start of `tail` (what precedes its path, query or
/// fragment). A password with an unescaped `/`, `?` or `#` in it (`http://u:pa/ss@host/`, which
/// no URL parser accepts, so it reaches the text of a location error as typed) ends the authority
/// early at a "port" that is not a number: then the authority runs to the last `@` and the rest
/// of its segment, so that the password is taken for userinfo and redacted with it.
fn authority_len(tail: &str) -> usize {
    let end = |from: usize| tail[from..].find(['/', '?', '#']).map_or(tail.len(), |e| from + e);
    let first = end(0);
    let authority = &tail[..first];
    // The port is what follows the last `:` outside an IPv6 literal's brackets.
    let host_port = authority.rsplit(']').next().unwrap_or(authority);
    let bad_port =
        host_port.rsplit_once(':').is_some_and(|(_, port)| !port.bytes().all(|b| b.is_ascii_digit()));
    match tail.rfind('@') {
        Some(at) if !authority.contains('@') && bad_port && at > first => end(at),
        _ => first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn passwords_and_query_values_are_redacted() {
        let cases = [
            ("http://u:hunter2@127.0.0.1:1/ckpt/", "http://u:***@127.0.0.1:1/ckpt/"),
            ("https://TOKEN@host/x", "https://***@host/x"),
            (
                "error sending request for url (http://h/m.safetensors?X-Amz-Signature=abc&X-Amz-Date=1)",
                // A value runs to whitespace or a quote: the `)` goes with it (safe side).
                "error sending request for url (http://h/m.safetensors?X-Amz-Signature=***&X-Amz-Date=***",
            ),
            ("https://a.blob/c/m?sv=1&sig=SECRET#frag", "https://a.blob/c/m?sv=***&sig=***#frag"),
            ("no url here: token=abc", "no url here: token=abc"),
            ("s3://bucket/key", "s3://bucket/key"),
            // A password with an unescaped `/`, `?` or `#` (no URL parser takes it: a location
            // error echoes it as typed).
            ("http://u:pa/ss@h:1/x", "http://u:***@h:1/x"),
            ("http://u:p?w=1@h/x?sig=s", "http://u:***@h/x?sig=***"),
            ("http://u:p#w@h/x", "http://u:***@h/x"),
            // A port, or an IPv6 literal, is no password: an `@` further on is the path's.
            ("http://h:8080/a@b", "http://h:8080/a@b"),
            ("http://[::1]:8080/a@b", "http://[::1]:8080/a@b"),
            ("http://[::1]/a@b", "http://[::1]/a@b"),
            (
                "two http://a:b@x/ and \"http://c:d@y/?token=t\"",
                "two http://a:***@x/ and \"http://c:***@y/?token=***\"",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "{input}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Whatever surrounds it, a password or query value never survives redaction, and text
        /// without `://` is left alone.
        #[test]
        fn no_secret_survives(
            prefix in "[a-z (]{0,8}",
            user in "[a-z]{1,6}",
            host in "[a-z0-9.]{1,10}(:[0-9]{1,5})?",
            path in "(/[a-z0-9._-]{0,8}){0,3}",
            key in "[A-Za-z-]{1,12}",
            suffix in "[ )a-z]{0,8}",
            // A password may hold an unescaped `/`, `?` or `#` as typed.
            sep in "[/?#]?",
        ) {
            let secret = "S3cr3tXYZ";
            let text = format!("{prefix}https://{user}:Pa{sep}ss9Q@{host}{path}?{key}={secret}{suffix}");
            let out = redact(&text);
            prop_assert!(!out.contains(secret) && !out.contains("ss9Q"), "{}", out);
            prop_assert!(out.contains(&host), "{}", out);
            let plain = format!("{prefix}{user} {key}={secret}{suffix}");
            prop_assert_eq!(redact(&plain), plain);
        }
    }
}
