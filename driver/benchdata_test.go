package driver

import (
	"fmt"
	"testing"
)

// benchSpec is the bundle the benchmarks start.
func benchSpec(b *testing.B, env string) Spec { return bankSpec(env) }

// benchWrite is a call that changes session i's world.
func benchWrite(i int) (tool, args string) {
	return "deposit", fmt.Sprintf(`{"id":"a1","amount":%d}`, i+1)
}

// benchRead is a read call.
func benchRead(int) (tool, args string) { return "get_account", `{"id":"a1"}` }
