package cronoq

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Metadata keys of cronoq's servers: a shard redirect names the shard's endpoint, and every URL the
// cluster gives that shard; an answer with an output names the output's content type.
const (
	shardEndpointKey  = "cronoq-shard-endpoint"
	shardEndpointsKey = "cronoq-shard-endpoints"
	outputTypeKey     = "cronoq-output-content-type"
	poolKey           = "cronoq-pool"
)

// endpoint is where a connection goes: a gRPC address and whether it uses TLS.
type endpoint struct {
	address string
	secure  bool
}

// parseTarget accepts host:port or an http://, https:// or grpc:// URL (a trailing / is dropped);
// https:// always means TLS. TLS settings with an http:// target are an error rather than a plaintext
// connection the caller did not mean.
func parseTarget(target string, withTLS bool) (endpoint, error) {
	if target == "" {
		return endpoint{}, fmt.Errorf("cronoq: Target: empty (expected host:port or an http(s):// URL)")
	}
	for _, prefix := range []string{"https://", "http://", "grpc://"} {
		if strings.HasPrefix(target, prefix) {
			if prefix == "http://" && withTLS {
				return endpoint{}, fmt.Errorf("cronoq: Target: %q is plain http:// but TLS settings are given (use https://)", target)
			}
			address := strings.TrimRight(target[len(prefix):], "/")
			if address == "" {
				return endpoint{}, fmt.Errorf("cronoq: Target: %q names no host", target)
			}
			return endpoint{address, withTLS || prefix == "https://"}, nil
		}
	}
	return endpoint{strings.TrimRight(target, "/"), withTLS}, nil
}

// dial opens a connection that takes messages of any size (a server bounds what it sends by its
// limits.max_message_bytes, which may be above gRPC's 4 MiB default), pings while a call is open so a
// stream to a server that froze or was cut off fails instead of waiting forever, and retries a lost
// connection at most 5 s apart (gRPC's default grows to 120 s). tlsConfig is nil for plaintext; home
// says whether the endpoint is the configured target, whose ServerName override would break the host
// check against any other shard.
func dial(ep endpoint, tlsConfig *tls.Config, home bool, extra []grpc.DialOption) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 20 * time.Second,
		}),
	}
	if ep.secure {
		cfg := &tls.Config{}
		if tlsConfig != nil {
			cfg = tlsConfig.Clone()
		}
		if !home {
			cfg.ServerName = ""
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	} else {
		opts = append(opts, grpc.WithInsecure())
	}
	return grpc.Dial(ep.address, append(opts, extra...)...)
}

// withToken adds the bearer token to a call's metadata; per-call metadata rather than call credentials,
// which gRPC refuses on plaintext connections.
func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// ------------------------------------------------------------------------------- shard redirects

// origin is what redirects are compared by: scheme, canonical host (lower-case, no trailing dot, an IP
// address in its canonical form) and port (the scheme's default when the URL names none).
type origin struct {
	scheme string
	host   string
	port   int
}

func (o origin) String() string {
	return o.scheme + "://" + net.JoinHostPort(o.host, strconv.Itoa(o.port))
}

// parseOrigin splits an http:// or https:// URL with a host, or says why it is none.
func parseOrigin(raw string) (origin, *url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return origin{}, nil, fmt.Errorf("it is not a valid URL (%v)", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return origin{}, nil, fmt.Errorf("it is not an http:// or https:// URL with a host")
	}
	port := 80
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return origin{}, nil, fmt.Errorf("it is not a valid URL (port %q)", p)
		}
		port = n
	}
	return origin{u.Scheme, canonicalHost(u.Hostname()), port}, u, nil
}

func canonicalHost(host string) string {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if ip := net.ParseIP(host); ip != nil {
		return ip.String()
	}
	return host
}

// addressHost is the canonical host of a gRPC host:port address ("" when it has none).
func addressHost(address string) string {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = strings.Trim(address, "[]")
	}
	return canonicalHost(host)
}

// isLoopback: localhost or a loopback IP address, a host whose traffic never leaves this machine.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redirect is a shard redirect as received: where to go, and the origins of every URL the server gives
// that shard (nil from a server that does not say: a reference server, or an older one).
type redirect struct {
	url   string
	named map[origin]bool
}

// redirectFrom reads a redirect from a refused stream's trailing metadata, then its header.
func redirectFrom(mds ...metadata.MD) *redirect {
	for _, md := range mds {
		values := md.Get(shardEndpointKey)
		if len(values) == 0 {
			continue
		}
		r := &redirect{url: values[0]}
		if listed := md.Get(shardEndpointsKey); len(listed) > 0 {
			r.named = map[origin]bool{}
			for _, entry := range strings.Split(listed[0], ",") {
				if o, _, err := parseOrigin(strings.TrimSpace(entry)); err == nil {
					r.named[o] = true
				}
			}
		}
		return r
	}
	return nil
}

// redirects decides whether a worker follows a shard redirect, and where to, under the rules of the
// Python SDK (docs/sdk-python.md, "Shard redirects"). A redirect comes from the network, so it must not
// strip TLS, carry credentials in the URL, or send the token in the clear to another machine (a loopback
// URL counts as this machine only when home is on it too). And it must lead only where the cluster says
// the shard is: the worker hands home its token anyway, so the URLs home names are trusted and kept
// until home names others, while a shard it was sent to could be sending it anywhere. A server that
// names nothing is followed only to home's own host.
type redirects struct {
	home       endpoint
	sendsToken bool
	allowHTTP  bool
	named      map[origin]bool
}

func (r *redirects) follow(current endpoint, to *redirect) (endpoint, error) {
	o, u, err := parseOrigin(to.url)
	if err != nil {
		return endpoint{}, refused(to.url, err.Error())
	}
	if u.User != nil {
		return endpoint{}, refused(to.url, "it carries user information")
	}
	secure := o.scheme == "https"
	if current.secure && !secure {
		return endpoint{}, refused(to.url, "it would downgrade the connection from TLS to plain http")
	}
	if !secure && r.sendsToken && !r.allowHTTP {
		if !isLoopback(o.host) {
			return endpoint{}, refused(to.url, "it would send the token over plain http to another host (set InsecureRedirectHTTP on trusted networks)")
		}
		if !isLoopback(addressHost(r.home.address)) {
			return endpoint{}, refused(to.url, "it would send the token over plain http to a port of this machine, which any local program may hold, while the configured target is another host (set InsecureRedirectHTTP on trusted networks)")
		}
	}
	if current == r.home && to.named != nil {
		r.named = to.named
	}
	if r.named != nil {
		if !r.named[o] {
			known := make([]string, 0, len(r.named))
			for n := range r.named {
				known = append(known, n.String())
			}
			sort.Strings(known)
			return endpoint{}, refused(to.url, fmt.Sprintf("it is not one of the shard endpoints the configured target named (%s)", strings.Join(known, ", ")))
		}
	} else if o.host != addressHost(r.home.address) {
		return endpoint{}, refused(to.url, "the server named no shard endpoints to check it against (an older or a reference server) and it is not the configured target's host")
	}
	return endpoint{u.Host, secure}, nil
}

func refused(url, why string) error {
	return status.Errorf(codes.FailedPrecondition, "refusing shard redirect to %q: %s", url, why)
}
