// Package deps pins the project's direct dependencies until the packages that use them land.
package deps

import (
	_ "github.com/danielgtaylor/huma/v2"
	_ "github.com/knadh/koanf/v2"
	_ "github.com/minio/minio-go/v7"
	_ "github.com/moby/moby/client"
	_ "github.com/temporalio/ui-server/v2/server"
	_ "github.com/uptrace/bun"
	_ "github.com/uptrace/bun/dialect/pgdialect"
	_ "github.com/uptrace/bun/dialect/sqlitedialect"
	_ "github.com/uptrace/bun/driver/pgdriver"
	_ "github.com/uptrace/bun/driver/sqliteshim"
	_ "go.starlark.net/starlark"
	_ "go.temporal.io/sdk/client"
	_ "go.temporal.io/server/temporal"
)

import (
	_ "github.com/danielgtaylor/huma/v2/adapters/humago"
	_ "github.com/danielgtaylor/huma/v2/humatest"
	_ "github.com/knadh/koanf/parsers/yaml"
	_ "github.com/knadh/koanf/providers/confmap"
	_ "github.com/knadh/koanf/providers/env/v2"
	_ "github.com/knadh/koanf/providers/file"
	_ "github.com/knadh/koanf/providers/posflag"
	_ "github.com/spf13/pflag"
	_ "go.temporal.io/sdk/testsuite"
	_ "go.temporal.io/sdk/worker"
	_ "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	_ "go.temporal.io/server/temporaltest"
)
