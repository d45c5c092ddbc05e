package main

import (
	"context"
	"errors"
)

func runTwin(ctx context.Context, e env) error {
	return errors.New("twin: not wired yet")
}
