package api

import (
	"time"

	"context"
	"net"
	"strings"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // exporters compress with gzip: registering it lets the server read them
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TraceService is OTLP/gRPC's TraceService (opentelemetry.proto.collector.trace.v1), over the ingest POST
// /v1/traces uses: the same workspace key (metadata authorization: Bearer …), project (x-doppel-project metadata
// over service.name), caps, rate limit and staging. Errors are the gRPC status OTLP/gRPC exporters read: its
// code says whether to retry (UNAVAILABLE, RESOURCE_EXHAUSTED with RetryInfo), its details are the ones
// POST /v1/traces answers with.
type TraceService struct {
	coltracepb.UnimplementedTraceServiceServer
	ingest *TraceIngest
}

// NewTraceService serves t over gRPC. t is filled by TracesRoutes once the API is built.
func NewTraceService(t *TraceIngest) *TraceService { return &TraceService{ingest: t} }

// NewGRPCServer is a gRPC server holding the trace service, accepting messages up to collect's request cap. A
// connection with no call in flight for idle is closed (GOAWAY; 0: DefaultIdleTimeout), as the HTTP listener
// closes idle keep-alive connections; a stream in flight is never cut by it.
func NewGRPCServer(s *TraceService, idle time.Duration) *grpc.Server {
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(int(s.ingest.opts.Collect.MaxRequestBytes)),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle}))
	coltracepb.RegisterTraceServiceServer(g, s)
	return g
}

// Export stages an export, as POST /v1/traces does.
func (s *TraceService) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	t := s.ingest
	ctx = newRequest(ctx, t.logger(ctx))
	md, _ := metadata.FromIncomingContext(ctx)
	first := func(k string) string {
		if v := md.Get(k); len(v) > 0 {
			return strings.TrimSpace(v[0])
		}
		return ""
	}
	address := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		address = p.Addr.String()
		if host, _, err := net.SplitHostPort(address); err == nil {
			address = host
		}
	}
	if te := t.admit(address); te != nil {
		return nil, grpcError(ctx, te)
	}
	p, te := t.authenticate(ctx, first("authorization"))
	if te != nil {
		return nil, grpcError(ctx, te)
	}
	resp, te := t.export(ctx, p, first(strings.ToLower(projectHeader)), req, int64(proto.Size(req)))
	if te != nil {
		return nil, grpcError(ctx, te)
	}
	return resp, nil
}

// grpcError is the gRPC status of a refused export: traceStatus's, whose code is chosen for OTLP/gRPC's retry rules.
func grpcError(ctx context.Context, te *traceError) error {
	e := te.env
	if e.RequestID == "" {
		e.RequestID = RequestID(ctx)
	}
	st, err := traceStatus(e, te.retryAfter)
	if err != nil {
		return status.Error(grpcCodeOf(e), e.Detail)
	}
	return status.ErrorProto(st)
}
