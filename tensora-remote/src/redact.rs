//! The one place secrets are taken out of text: passwords in URLs (`http://user:password@host/`)
//! and every query-string value (`X-Amz-Signature`, `sig`, `token`, presigned URLs: a query value
//! is treated as a secret whatever its name), every bare query token (`?TOKEN`, a pair without
//! `=`) and every fragment's content (`#access_token=...`). Every URL this crate prints goes through
//! `redact_url`, and every message that comes from elsewhere (the HTTP client's errors, the
//! input of a bad location) through [`redact`], so no error, report, `Debug` output or finding
//! carries a credential.

use url::Url;

/// What a redacted secret is replaced with.
pub const REDACTED: &str = "***";

/// `url` as printable text: its password (or a user name given without one, which is then a
/// token), every query value, every query pair without `=` and its fragment's content (the `#`
/// kept) replaced by [`REDACTED`].
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

/// Redacts what follows `scheme://`: the userinfo of the authority, each query value or bare
/// query token, then the fragment.
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
    // A fragment runs to the URL's end, a `?` in it included; it can carry a token
    // (`#access_token=...`), so what follows its `#` is redacted whole.
    let (path_and_query, fragment) = match path_and_more.find('#') {
        Some(h) => path_and_more.split_at(h),
        None => (path_and_more, ""),
    };
    let (path, query) = match path_and_query.find('?') {
        Some(q) => path_and_query.split_at(q),
        None => (path_and_query, ""),
    };
    out.push_str(path);
    if let Some(query) = query.strip_prefix('?') {
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            out.push_str(&redact_pair(pair));
        }
    }
    if let Some(content) = fragment.strip_prefix('#') {
        out.push('#');
        if !content.is_empty() {
            out.push_str(REDACTED);
        }
    }
    out
}

/// One `key=value` pair of a query with its value redacted; a pair without `=` is a bare token
/// (`?TOKEN`, `&SIGNATURE`) and redacted whole. Empty values and empty pairs carry nothing.
fn redact_pair(pair: &str) -> std::borrow::Cow<'_, str> {
    match pair.split_once('=') {
        Some((key, value)) if !value.is_empty() => format!("{key}={REDACTED}").into(),
        None if !pair.is_empty() => REDACTED.into(),
        _ => pair.into(),
    }
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
            ("https://a.blob/c/m?sv=1&sig=SECRET#frag", "https://a.blob/c/m?sv=***&sig=***#***"),
            // A bare query token, or a pair without `=` among others, is a secret whole.
            ("https://h/p?TOKEN", "https://h/p?***"),
            ("https://h/p?sv=1&SIGNATUREONLY&b=", "https://h/p?sv=***&***&b="),
            // A fragment's content is redacted, with or without a query; a `?` after `#` is
            // the fragment's.
            ("https://h/p#access_token=T0K&x=1", "https://h/p#***"),
            ("https://h/p#frag?sig=S", "https://h/p#***"),
            ("https://h#T0K", "https://h#***"),
            ("https://h/p?a=1#T0K more", "https://h/p?a=***#*** more"),
            ("http://u:p#w@h/x#T0K", "http://u:***@h/x#***"),
            // Nothing secret: unchanged (an empty query, empty pairs, an empty fragment).
            ("https://h.example:8443/a/b.safetensors", "https://h.example:8443/a/b.safetensors"),
            ("https://h/p?", "https://h/p?"),
            ("https://h/p?&&", "https://h/p?&&"),
            ("https://h/p#", "https://h/p#"),
            ("see https://h/p, then ?TOKEN and #frag", "see https://h/p, then ?TOKEN and #frag"),
            ("no url: ?TOKEN #access_token=abc", "no url: ?TOKEN #access_token=abc"),
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
        /// Whatever surrounds it, a password, a query value, a bare query token or a fragment
        /// never survives redaction, and text without `://` is left alone.
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
            // Where the query's secret sits: a value, a bare token alone, a bare token after a
            // pair, or none (then the fragment holds one).
            query_shape in 0..4usize,
            // The fragment: none, a bare token, `access_token=`, or a `?` inside it.
            fragment_shape in 0..4usize,
        ) {
            let secret = "S3cr3tXYZ";
            let token = "T0kQW";
            let query = match query_shape {
                0 => format!("?{key}={secret}"),
                1 => format!("?{secret}"),
                2 => format!("?{key}=v&{secret}"),
                _ => String::new(),
            };
            let fragment = match (query_shape, fragment_shape) {
                (3, 0) | (_, 1) => format!("#{token}"),
                (_, 0) => String::new(),
                (_, 2) => format!("#access_token={token}&x=1"),
                _ => format!("#x?{key}={token}"),
            };
            let text = format!("{prefix}https://{user}:Pa{sep}ss9Q@{host}{path}{query}{fragment}{suffix}");
            let out = redact(&text);
            for hidden in [secret, token, "ss9Q"] {
                prop_assert!(!out.contains(hidden), "{} in {}", hidden, out);
            }
            prop_assert!(out.contains(&host), "{}", out);
            let plain = format!("{prefix}{user} {key}={secret}{suffix} ?{secret} #{token}");
            prop_assert_eq!(redact(&plain), plain);
            // A URL with nothing secret in it comes back as it was.
            let clean = format!("{prefix}https://{host}{path}{suffix}");
            prop_assert_eq!(redact(&clean), clean);
        }
    }
}
