package cronoq

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestParseTarget(t *testing.T) {
	cases := []struct {
		target  string
		tls     bool
		want    endpoint
		problem string
	}{
		{"127.0.0.1:7070", false, endpoint{"127.0.0.1:7070", false}, ""},
		{"http://cronoq:7070/", false, endpoint{"cronoq:7070", false}, ""},
		{"grpc://cronoq:7070", true, endpoint{"cronoq:7070", true}, ""},
		{"https://cronoq:7070", false, endpoint{"cronoq:7070", true}, ""},
		{"cronoq:7070", true, endpoint{"cronoq:7070", true}, ""},
		{"http://cronoq:7070", true, endpoint{}, "plain http:// but TLS settings are given"},
		{"", false, endpoint{}, "Target: empty"},
		{"https://", false, endpoint{}, "names no host"},
	}
	for _, c := range cases {
		got, err := parseTarget(c.target, c.tls)
		if c.problem != "" {
			if err == nil || !strings.Contains(err.Error(), c.problem) {
				t.Errorf("parseTarget(%q): error %v, want one saying %q", c.target, err, c.problem)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("parseTarget(%q, %v) = %v, %v; want %v", c.target, c.tls, got, err, c.want)
		}
	}
}

func named(urls ...string) *redirect {
	r := redirectFrom(map[string][]string{shardEndpointKey: {urls[0]}, shardEndpointsKey: {strings.Join(urls[1:], ",")}})
	return r
}

func TestRedirects(t *testing.T) {
	loopback := endpoint{"127.0.0.1:7000", false}
	remote := endpoint{"router.internal:7000", false}
	secure := endpoint{"router.internal:7000", true}
	cases := []struct {
		name      string
		home      endpoint
		token     bool
		allowHTTP bool
		to        *redirect
		want      endpoint
		problem   string
	}{
		{"named loopback shard", loopback, true, false, named("http://127.0.0.1:7001", "http://127.0.0.1:7001"), endpoint{"127.0.0.1:7001", false}, ""},
		{"not among the named", loopback, true, false, named("http://127.0.0.1:7002", "http://127.0.0.1:7001"), endpoint{}, "not one of the shard endpoints the configured target named (http://127.0.0.1:7001)"},
		{"named compared by origin", secure, true, false, named("https://Shard-B.:443/", "https://shard-b"), endpoint{"Shard-B.:443", true}, ""},
		{"tls to plain http", secure, false, false, named("http://shard-b:7001", "http://shard-b:7001"), endpoint{}, "downgrade the connection from TLS"},
		{"token over http to another host", remote, true, false, named("http://shard-b:7001", "http://shard-b:7001"), endpoint{}, "send the token over plain http to another host"},
		{"allowed over http on trusted networks", remote, true, true, named("http://shard-b:7001", "http://shard-b:7001"), endpoint{"shard-b:7001", false}, ""},
		{"without a token plain http is no leak", remote, false, false, named("http://shard-b:7001", "http://shard-b:7001"), endpoint{"shard-b:7001", false}, ""},
		{"loopback while home is remote", remote, true, false, named("http://127.0.0.1:7001", "http://127.0.0.1:7001"), endpoint{}, "a port of this machine"},
		{"user information", secure, true, false, named("https://user:pw@shard-b:7001", "https://shard-b:7001"), endpoint{}, "user information"},
		{"not a URL", secure, true, false, named("shard-b:7001", "https://shard-b:7001"), endpoint{}, "not an http:// or https:// URL"},
		{"nothing named: home's host only", loopback, true, false, &redirect{url: "http://127.0.0.1:7003"}, endpoint{"127.0.0.1:7003", false}, ""},
		{"nothing named: another host", secure, true, false, &redirect{url: "https://shard-b:7003"}, endpoint{}, "named no shard endpoints"},
	}
	for _, c := range cases {
		r := redirects{home: c.home, sendsToken: c.token, allowHTTP: c.allowHTTP}
		got, err := r.follow(c.home, c.to)
		if c.problem != "" {
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), c.problem) {
				t.Errorf("%s: error %v, want FailedPrecondition saying %q", c.name, err, c.problem)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}

// A shard the worker was sent to cannot widen where it may go: only home's list counts.
func TestRedirectsKeepHomesList(t *testing.T) {
	home := endpoint{"127.0.0.1:7000", false}
	r := redirects{home: home, sendsToken: true}
	shard, err := r.follow(home, named("http://127.0.0.1:7001", "http://127.0.0.1:7001"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.follow(shard, named("http://127.0.0.1:7009", "http://127.0.0.1:7009"))
	if err == nil || !strings.Contains(err.Error(), "not one of the shard endpoints") {
		t.Fatalf("a shard's own list was trusted: %v", err)
	}
}
