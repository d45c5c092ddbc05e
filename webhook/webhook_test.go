package webhook_test

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/doppel-dev/doppel/internal/hooktest"
	"github.com/doppel-dev/doppel/webhook"
)

func TestGuardAllowed(t *testing.T) {
	g := &webhook.Guard{}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"8.8.8.8", true}, {"2606:4700:4700::1111", true}, {"93.184.216.34", true},
		{"127.0.0.1", false}, {"127.5.6.7", false}, {"::1", false}, {"::ffff:127.0.0.1", false},
		{"10.1.2.3", false}, {"172.16.0.1", false}, {"172.31.255.255", false}, {"192.168.1.1", false},
		{"169.254.169.254", false}, {"fe80::1", false}, {"fd00:ec2::254", false}, {"fc00::1", false},
		{"100.64.0.1", false}, {"0.0.0.0", false}, {"::", false}, {"224.0.0.1", false}, {"255.255.255.255", false},
		{"198.18.0.1", false}, {"64:ff9b::7f00:1", false}, {"2002:7f00:1::", false}, {"::ffff:169.254.169.254", false},
		// IPv6 forms that embed an IPv4 address: the deprecated IPv4-compatible ::a.b.c.d and SIIT's ::ffff:0:a.b.c.d
		// are judged by the IPv4 address they carry.
		{"::127.0.0.1", false}, {"::10.0.0.1", false}, {"::169.254.169.254", false}, {"::ffff:0:127.0.0.1", false},
		{"::ffff:0:10.0.0.1", false}, {"::ffff:0:192.168.1.1", false}, {"::8.8.8.8", true}, {"::ffff:0:8.8.8.8", true},
	} {
		if got := g.Allowed(netip.MustParseAddr(tc.addr)); got != tc.ok {
			t.Errorf("Allowed(%s) = %v, want %v", tc.addr, got, tc.ok)
		}
	}
	allow, err := webhook.ParseCIDRs([]string{"127.0.0.0/8", " ::1 ", ""})
	if err != nil {
		t.Fatal(err)
	}
	g = &webhook.Guard{Allow: allow}
	if !g.Allowed(netip.MustParseAddr("127.0.0.1")) || !g.Allowed(netip.MustParseAddr("::1")) || g.Allowed(netip.MustParseAddr("10.0.0.1")) ||
		g.Allowed(netip.MustParseAddr("::10.0.0.1")) || g.Allowed(netip.MustParseAddr("::ffff:0:10.0.0.1")) {
		t.Error("allow_cidrs 127.0.0.0/8 and ::1 should allow loopback only")
	}
	if _, err := webhook.ParseCIDRs([]string{"not-a-cidr"}); err == nil {
		t.Error("ParseCIDRs accepted garbage")
	}
}

func TestCheckURL(t *testing.T) {
	g := &webhook.Guard{}
	ctx := context.Background()
	for _, tc := range []struct {
		url, want string // want: "" for allowed, else a word of the error
	}{
		{"https://8.8.8.8/hook", ""},
		{"http://[2606:4700:4700::1111]:8443/x", ""},
		{"ftp://8.8.8.8/", "scheme"},
		{"https://user:pw@8.8.8.8/", "user info"},
		{"https:///nohost", "no host"},
		{"http://127.0.0.1:8080/", "not allowed"},
		{"http://[::1]/", "not allowed"},
		{"http://169.254.169.254/latest/meta-data/", "not allowed"},
		{"http://10.0.0.5/", "not allowed"},
		{"http://localhost:9/", "not allowed"},
		{"http://app.localhost/", "not allowed"},
		{"http://[::127.0.0.1]/", "not allowed"},
		{"http://[::ffff:0:127.0.0.1]/", "not allowed"},
		{"http://[::10.0.0.1]/", "not allowed"},
		{"http://[::ffff:0:10.0.0.1]/", "not allowed"},
		{"http://[0:0:0:0:ffff:0:a00:1]:8080/", "not allowed"},
	} {
		err := g.CheckURL(ctx, tc.url)
		switch {
		case tc.want == "" && err != nil && !strings.Contains(err.Error(), "resolve"):
			t.Errorf("CheckURL(%s) = %v, want allowed", tc.url, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckURL(%s) = %v, want an error about %q", tc.url, err, tc.want)
		}
	}
}

// The dialer refuses a forbidden address at connect time, whatever a URL check said before: a name that resolved
// to a public address when the endpoint was created and to loopback now (DNS rebinding) reaches nothing.
func TestSenderRefusesForbiddenAddressAtDial(t *testing.T) {
	rcv := hooktest.NewReceiver()
	defer rcv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(rcv.URL, "http://"))
	s := webhook.NewSender(&webhook.Guard{}, 5*time.Second)
	// The IPv6 forms embedding 127.0.0.1 are refused by the dialer too (not merely unreachable).
	for _, u := range []string{rcv.URL, "http://localhost:" + port + "/", "http://[::127.0.0.1]:" + port + "/",
		"http://[::ffff:0:127.0.0.1]:" + port + "/"} {
		res := s.Send(context.Background(), webhook.Request{URL: u, Secret: webhook.NewSecret(), ID: "evt_1", Timestamp: time.Now(), Body: []byte(`{}`)})
		if res.OK() || res.StatusCode != 0 || !strings.Contains(res.Detail, "not allowed") {
			t.Errorf("send to %s: %+v, want refused before connecting", u, res)
		}
	}
	if n := len(rcv.Messages()); n != 0 {
		t.Fatalf("the receiver got %d requests through a refusing dialer", n)
	}
	// Redirects are not followed (a redirect to a metadata address would otherwise be).
	redirect := &http.Server{Handler: http.RedirectHandler("http://169.254.169.254/", http.StatusFound)}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = redirect.Serve(ln) }()
	defer redirect.Close()
	allow, _ := webhook.ParseCIDRs([]string{"127.0.0.0/8"})
	res := webhook.NewSender(&webhook.Guard{Allow: allow}, 5*time.Second).Send(context.Background(),
		webhook.Request{URL: "http://" + ln.Addr().String() + "/", Secret: webhook.NewSecret(), ID: "evt_1", Timestamp: time.Now(), Body: []byte(`{}`)})
	if res.OK() || res.StatusCode != http.StatusFound {
		t.Errorf("redirect: %+v, want the 302 itself as a failed attempt", res)
	}
}

// A sent request verifies with a verifier written from the spec's text (hooktest.Verify) and with the Standard
// Webhooks Go library; a tampered body, id or timestamp does not.
func TestSignature(t *testing.T) {
	rcv := hooktest.NewReceiver()
	defer rcv.Close()
	secret := webhook.NewSecret()
	if !webhook.ValidSecret(secret) || !strings.HasPrefix(secret, "whsec_") {
		t.Fatalf("secret %q", secret)
	}
	rcv.SetSecret(secret)
	allow, _ := webhook.ParseCIDRs([]string{"127.0.0.0/8"})
	s := webhook.NewSender(&webhook.Guard{Allow: allow}, 5*time.Second)
	body := []byte(`{"id":"evt_1","type":"session.opened","timestamp":"2026-11-24T20:00:00Z","data":{"session_id":"ses_1"}}`)
	res := s.Send(context.Background(), webhook.Request{URL: rcv.URL + "/hook", Secret: secret, ID: "evt_1", Timestamp: time.Now(), Body: body})
	if !res.OK() {
		t.Fatalf("send: %+v", res)
	}
	ms := rcv.Messages()
	if len(ms) != 1 || ms[0].Err != nil || ms[0].ID != "evt_1" || ms[0].Type != "session.opened" {
		t.Fatalf("received %+v", ms)
	}
	h := ms[0].Header
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := wh.Verify(body, h); err != nil {
		t.Fatalf("the Standard Webhooks library refuses the signature: %v", err)
	}
	now := time.Now()
	tampered := append([]byte(nil), body...)
	tampered[len(tampered)-3] = 'X'
	if hooktest.Verify(secret, h, tampered, now) == nil || wh.Verify(tampered, h) == nil {
		t.Error("a tampered body verified")
	}
	other := h.Clone()
	other.Set("webhook-id", "evt_2")
	if hooktest.Verify(secret, other, body, now) == nil {
		t.Error("another webhook-id verified")
	}
	if hooktest.Verify(secret, h, body, now.Add(10*time.Minute)) == nil {
		t.Error("a stale timestamp verified")
	}
	if hooktest.Verify(webhook.NewSecret(), h, body, now) == nil {
		t.Error("another secret verified")
	}
}
