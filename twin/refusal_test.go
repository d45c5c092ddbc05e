package twin

import (
	"testing"

	"github.com/doppel-dev/doppel/jsonvalue"
)

func TestIDKind(t *testing.T) {
	for _, tt := range []struct {
		in, want string
		ok       bool
	}{
		{`"certificate_7504069"`, "certificate_#", true},
		{`"gift_card_12a34"`, "gift_card_#a#", true},
		{`"2024-05-13"`, "", false}, // no letters: a date, not an id
		{`"HAT030"`, "HAT#", true},
		{`"economy"`, "", false},
		{`12`, "", false},
	} {
		got, ok := idKind(tt.in)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("idKind(%s) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestRefusalByKind(t *testing.T) {
	mk := func(args, answer string, isErr bool) *rec {
		v, err := jsonvalue.ParseString(args)
		if err != nil {
			t.Fatal(err)
		}
		return &rec{flat: flatten(v), answer: answer, isErr: isErr}
	}
	const refused = "Error: certificate cannot be used to update reservation"
	all := []*rec{
		mk(`{"reservation_id": "AAA111", "payment_id": "certificate_1111111"}`, refused, true),
		mk(`{"reservation_id": "BBB222", "payment_id": "certificate_2222222"}`, refused, true),
		mk(`{"reservation_id": "CCC333", "payment_id": "credit_card_3333333"}`, `{"ok": 1}`, false),
		mk(`{"reservation_id": "DDD444", "payment_id": "gift_card_4444444"}`, "Error: gift card balance is not enough", true),
		mk(`{"reservation_id": "EEE555", "payment_id": "gift_card_5555555"}`, `{"ok": 2}`, false),
	}
	call := func(args string) map[string]string {
		v, err := jsonvalue.ParseString(args)
		if err != nil {
			t.Fatal(err)
		}
		return flatten(v)
	}
	// A certificate no recording names is refused, whatever reservation (recorded or made up) it is for.
	if r := refusalByKind(all, call(`{"reservation_id": "ZZZ999", "payment_id": "certificate_9999999"}`)); r == nil || r.answer != refused {
		t.Errorf("new certificate: %v, want the recorded refusal", r)
	}
	// Gift cards were refused once and succeeded once: their kind explains nothing.
	if r := refusalByKind(all, call(`{"reservation_id": "ZZZ999", "payment_id": "gift_card_9999999"}`)); r != nil {
		t.Errorf("gift card: refused with %q, want no refusal", r.answer)
	}
	// One refused id alone is not a kind: with only one certificate recorded, nothing is learned.
	if r := refusalByKind(all[1:], call(`{"reservation_id": "ZZZ999", "payment_id": "certificate_9999999"}`)); r != nil {
		t.Errorf("one recorded certificate: refused with %q, want no refusal", r.answer)
	}
	// A kind that never succeeded anywhere (no other kind succeeded either) explains nothing.
	if r := refusalByKind(all[:2], call(`{"reservation_id": "ZZZ999", "payment_id": "certificate_9999999"}`)); r != nil {
		t.Errorf("no successes: refused with %q, want no refusal", r.answer)
	}
}
