package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/doppel-dev/doppel/schema"
)

func runMigrate(ctx context.Context, e env) error {
	cfg, _, err := parseConfig(e, "migrate", nil)
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	db, err := openDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := schema.Migrate(ctx, db); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	fmt.Fprintf(e.stdout, "migrations applied (%s)\n", cfg.DB.Driver)
	return nil
}
