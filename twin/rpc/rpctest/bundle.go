// Package rpctest provides a small real twin bundle for tests of code that runs twins.
package rpctest

import (
	"encoding/json"

	"github.com/doppel-dev/doppel/twin"
)

// BankBundle returns the bytes of a small real bundle: a table "accounts" (rows a1 with balance 10, a2 with 0) and
// two provided Starlark tools, get_account {"id"} and deposit {"id", "amount"}; both answer the tool error
// "Error: account not found" for an unknown id.
func BankBundle() ([]byte, error) {
	const get = `
def handle(args):
    row = world.get("accounts", args["id"])
    if row == None:
        return error("Error: account not found")
    return row
`
	const deposit = `
def handle(args):
    row = world.get("accounts", args["id"])
    if row == None:
        return error("Error: account not found")
    row["balance"] = row["balance"] + args["amount"]
    world.put("accounts", args["id"], row)
    return row
`
	schema := json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}`)
	b := &twin.Bundle{
		Format:       twin.FormatVersion,
		SchemaSource: "provided",
		Tools: []twin.Tool{
			{Name: "get_account", InputSchema: schema, Binding: twin.BindingProvided, Rung: twin.RungProvided, Kind: twin.KindRead, Provided: get, Table: "accounts", KeyArg: "id"},
			{Name: "deposit", InputSchema: schema, Binding: twin.BindingProvided, Rung: twin.RungProvided, Kind: twin.KindWrite, Provided: deposit, Table: "accounts", KeyArg: "id"},
		},
		Tables: []twin.Table{{Name: "accounts", Key: "id", KeyInRow: true, Rows: []twin.Row{
			{Key: "a1", JSON: `{"id": "a1", "balance": 10}`},
			{Key: "a2", JSON: `{"id": "a2", "balance": 0}`},
		}}},
	}
	return b.Marshal()
}
