//! The target a worker is given, and the shard redirects it follows, under the rules of the Python SDK
//! (docs/sdk-python.md, "Shard redirects"), as the Go SDK follows them.

use std::collections::BTreeSet;
use std::net::IpAddr;

use http::HeaderMap;

use crate::errors::{Code, WorkerError};
use crate::grpc::Endpoint;

const SHARD_ENDPOINT: &str = "cronoq-shard-endpoint";
const SHARD_ENDPOINTS: &str = "cronoq-shard-endpoints";

/// Parses host:port or an http://, https:// or grpc:// URL (a trailing / is dropped); https:// always
/// means TLS. TLS settings with an http:// target are an error rather than a plaintext connection the
/// caller did not mean.
pub(crate) fn parse_target(target: &str, with_tls: bool) -> Result<Endpoint, WorkerError> {
    if target.is_empty() {
        return Err(WorkerError::invalid(
            "target",
            "empty (expected host:port or an http(s):// URL)",
        ));
    }
    for prefix in ["https://", "http://", "grpc://"] {
        if let Some(rest) = target.strip_prefix(prefix) {
            if prefix == "http://" && with_tls {
                return Err(WorkerError::invalid(
                    "target",
                    format!("{target:?} is plain http:// but TLS settings are given (use https://)"),
                ));
            }
            let address = rest.trim_end_matches('/');
            if address.is_empty() {
                return Err(WorkerError::invalid(
                    "target",
                    format!("{target:?} names no host"),
                ));
            }
            return Ok(Endpoint {
                address: address.to_string(),
                secure: with_tls || prefix == "https://",
            });
        }
    }
    Ok(Endpoint {
        address: target.trim_end_matches('/').to_string(),
        secure: with_tls,
    })
}

/// What redirects are compared by: scheme, canonical host (lower-case, no trailing dot, an IP address in
/// its canonical form) and port (the scheme's default when the URL names none).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}://[{}]:{}", self.scheme, self.host, self.port)
        } else {
            write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
        }
    }
}

/// Splits an http:// or https:// URL with a host into its origin and its authority (host:port as
/// written), or says why it is none.
fn parse_origin(raw: &str) -> Result<(Origin, String), String> {
    let uri: http::Uri = raw.parse().map_err(|e| format!("it is not a valid URL ({e})"))?;
    let scheme = uri.scheme_str().unwrap_or("");
    let authority = uri
        .authority()
        .ok_or("it is not an http:// or https:// URL with a host")?;
    if (scheme != "http" && scheme != "https") || authority.host().is_empty() {
        return Err("it is not an http:// or https:// URL with a host".into());
    }
    if authority.as_str().contains('@') {
        return Err("it carries user information".into());
    }
    let port = authority
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    let origin = Origin {
        scheme: scheme.to_string(),
        host: canonical_host(authority.host()),
        port,
    };
    let address = if authority.port().is_some() {
        authority.as_str().to_string()
    } else {
        format!("{}:{port}", authority.host())
    };
    Ok((origin, address))
}

fn canonical_host(host: &str) -> String {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let host = host.trim_end_matches('.');
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => host.to_string(),
    }
}

/// The canonical host of a host:port address.
pub(crate) fn address_host(address: &str) -> String {
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) && !host.ends_with(':') => host,
        _ => address,
    };
    canonical_host(host)
}

/// localhost or a loopback IP address: a host whose traffic never leaves this machine.
fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().map(|ip| ip.is_loopback()).unwrap_or(false)
}

/// A shard redirect as received: where to go, and the origins of every URL the server gives that
/// shard (None from a server that does not say: a reference server, or an older one).
#[derive(Debug, Clone)]
pub(crate) struct Redirect {
    pub url: String,
    named: Option<BTreeSet<Origin>>,
}

/// The redirect in a refused call's metadata, if any.
pub(crate) fn redirect_from(metadata: &HeaderMap) -> Option<Redirect> {
    let url = metadata.get(SHARD_ENDPOINT)?.to_str().ok()?.to_string();
    let named = metadata
        .get(SHARD_ENDPOINTS)
        .and_then(|v| v.to_str().ok())
        .map(|listed| {
            listed
                .split(',')
                .filter_map(|entry| parse_origin(entry.trim()).ok().map(|(o, _)| o))
                .collect()
        });
    Some(Redirect { url, named })
}

/// Decides whether a worker follows a shard redirect, and where to. A redirect comes from the network,
/// so it must not strip TLS, carry credentials in the URL, or send the token in the clear to another
/// machine (a loopback URL counts as this machine only when home is on it too). And it must lead only
/// where the cluster says the shard is: the worker hands home its token anyway, so the URLs home names
/// are trusted and kept until home names others, while a shard it was sent to could be sending it
/// anywhere. A server that names nothing is followed only to home's own host.
pub(crate) struct Redirects {
    pub home: Endpoint,
    pub sends_token: bool,
    pub allow_http: bool,
    named: Option<BTreeSet<Origin>>,
}

impl Redirects {
    pub fn new(home: Endpoint, sends_token: bool, allow_http: bool) -> Self {
        Redirects {
            home,
            sends_token,
            allow_http,
            named: None,
        }
    }

    pub fn follow(&mut self, current: &Endpoint, to: &Redirect) -> Result<Endpoint, WorkerError> {
        let refused = |why: &str| {
            WorkerError::new(
                Code::FailedPrecondition,
                format!("refusing shard redirect to {:?}: {why}", to.url),
            )
        };
        let (origin, address) = parse_origin(&to.url).map_err(|why| refused(&why))?;
        let secure = origin.scheme == "https";
        if current.secure && !secure {
            return Err(refused(
                "it would downgrade the connection from TLS to plain http",
            ));
        }
        if !secure && self.sends_token && !self.allow_http {
            if !is_loopback(&origin.host) {
                return Err(refused(
                    "it would send the token over plain http to another host (set insecure_redirect_http on trusted networks)",
                ));
            }
            if !is_loopback(&address_host(&self.home.address)) {
                return Err(refused(
                    "it would send the token over plain http to a port of this machine, which any local program may hold, while the configured target is another host (set insecure_redirect_http on trusted networks)",
                ));
            }
        }
        if *current == self.home && to.named.is_some() {
            self.named = to.named.clone();
        }
        match &self.named {
            Some(named) if !named.contains(&origin) => {
                let known: Vec<String> = named.iter().map(Origin::to_string).collect();
                return Err(refused(&format!(
                    "it is not one of the shard endpoints the configured target named ({})",
                    known.join(", ")
                )));
            }
            Some(_) => {}
            None if origin.host != address_host(&self.home.address) => {
                return Err(refused(
                    "the server named no shard endpoints to check it against (an older or a reference server) and it is not the configured target's host",
                ));
            }
            None => {}
        }
        Ok(Endpoint { address, secure })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirect(url: &str, named: Option<&str>) -> Redirect {
        let mut metadata = HeaderMap::new();
        metadata.insert(SHARD_ENDPOINT, url.parse().unwrap());
        if let Some(named) = named {
            metadata.insert(SHARD_ENDPOINTS, named.parse().unwrap());
        }
        redirect_from(&metadata).unwrap()
    }

    #[test]
    fn targets() {
        let ep = parse_target("https://cronoq.internal:7070/", false).unwrap();
        assert_eq!((ep.address.as_str(), ep.secure), ("cronoq.internal:7070", true));
        assert!(!parse_target("127.0.0.1:7070", false).unwrap().secure);
        let err = parse_target("http://127.0.0.1:7070", true).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert!(err.message.contains("WorkerOptions.target") && err.message.contains("use https://"));
        assert!(parse_target("", false).unwrap_err().message.contains("empty"));
    }

    #[test]
    fn never_from_https_to_http() {
        let home = parse_target("https://localhost:7070", false).unwrap();
        let mut r = Redirects::new(home.clone(), false, true);
        let err = r
            .follow(&home, &redirect("http://localhost:7071", None))
            .unwrap_err();
        assert!(err.message.contains("downgrade"), "{}", err.message);
    }

    #[test]
    fn token_over_plain_http_only_on_this_machine_unless_allowed() {
        let home = parse_target("http://10.0.0.1:7070", false).unwrap();
        let to = redirect("http://10.0.0.2:7071", Some("http://10.0.0.2:7071"));
        let err = Redirects::new(home.clone(), true, false)
            .follow(&home, &to)
            .unwrap_err();
        assert!(err.message.contains("insecure_redirect_http"), "{}", err.message);
        let ep = Redirects::new(home.clone(), true, true)
            .follow(&home, &to)
            .unwrap();
        assert_eq!(ep.address, "10.0.0.2:7071");
        let local = parse_target("127.0.0.1:7070", false).unwrap();
        let to = redirect("http://127.0.0.1:7071", Some("http://127.0.0.1:7071"));
        assert_eq!(
            Redirects::new(local.clone(), true, false)
                .follow(&local, &to)
                .unwrap()
                .address,
            "127.0.0.1:7071"
        );
    }

    #[test]
    fn only_where_home_says_the_shards_are() {
        let home = parse_target("https://router:7070", false).unwrap();
        let mut r = Redirects::new(home.clone(), true, false);
        let shard = r
            .follow(
                &home,
                &redirect(
                    "https://shard-b:7072",
                    Some("https://shard-a:7071, https://shard-b:7072"),
                ),
            )
            .unwrap();
        assert_eq!(shard.address, "shard-b:7072");
        // The shard cannot widen the list: only home names it.
        let err = r
            .follow(&shard, &redirect("https://evil:7073", Some("https://evil:7073")))
            .unwrap_err();
        assert!(
            err.message.contains("not one of the shard endpoints"),
            "{}",
            err.message
        );
        let err = Redirects::new(home.clone(), true, false)
            .follow(&home, &redirect("https://elsewhere:7071", None))
            .unwrap_err();
        assert!(
            err.message.contains("named no shard endpoints"),
            "{}",
            err.message
        );
        let err = r
            .follow(&home, &redirect("https://u:p@shard-a:7071", None))
            .unwrap_err();
        assert!(err.message.contains("user information"), "{}", err.message);
    }
}
