package kibotos_test

import (
	"crypto/tls"
	"errors"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/capability"
	"github.com/kibotos/kibotos/internal/ctrltest"
)

func TestClientAgainstServer(t *testing.T) {
	env := ctrltest.New(t, ctrltest.Options{})
	for name, opts := range ctrltest.Protocols {
		t.Run(name, func(t *testing.T) {
			c, err := kibotos.NewClient(env.URL,
				kibotos.WithTLSFiles(env.PKI.CA, env.PKI.Operator, env.PKI.OperatorKey),
				kibotos.WithConnectOptions(opts...))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			info, err := c.CheckCapabilities(t.Context(), ctrlv1connect.EgressServiceCreateEgressProcedure, ctrlv1connect.ResolverServiceGetResolverProcedure)
			if err != nil {
				t.Fatalf("CheckCapabilities(egress, resolver) = %v", err)
			}
			if !kibotos.HasCapability(info, capability.EgressManage) {
				t.Errorf("capabilities %v lack %q", info.GetCapabilities(), capability.EgressManage)
			}
			_, err = c.CheckCapabilities(t.Context(), ctrlv1connect.WorkspaceServiceCreateWorkspaceProcedure)
			var me *kibotos.MissingCapabilityError
			if !errors.As(err, &me) || me.Capability != capability.WorkspaceCreate {
				t.Errorf("CheckCapabilities(CreateWorkspace) = %v, want a missing %q", err, capability.WorkspaceCreate)
			}

			id := kibotos.NewCommandID()
			req := &ctrlv1.CreateEgressRequest{
				Metadata: &ctrlv1.CommandMetadata{CommandId: id},
				Spec:     &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "127.0.0.1:1080"}}},
			}
			res, err := c.EgressService.CreateEgress(t.Context(), connect.NewRequest(req))
			if err != nil {
				t.Fatalf("CreateEgress = %v", err)
			}
			_, err = c.EgressService.GetEgress(t.Context(), connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: res.Msg.GetEgress().GetEgressId() + "x"}))
			if connect.CodeOf(err) != connect.CodeNotFound || kibotos.Reason(err) != ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND {
				t.Errorf("GetEgress(unknown) = %v, want not_found with reason NOT_FOUND", err)
			}
		})
	}
}

func TestClientHTTP2(t *testing.T) {
	env := ctrltest.New(t, ctrltest.Options{})
	var proto string
	c, err := kibotos.NewClient(env.URL, kibotos.WithTLSFiles(env.PKI.CA, env.PKI.Operator, env.PKI.OperatorKey))
	if err != nil {
		t.Fatal(err)
	}
	tr := c.HTTPClient().Transport.(*http.Transport)
	tr.TLSClientConfig.VerifyConnection = func(cs tls.ConnectionState) error { proto = cs.NegotiatedProtocol; return nil }
	if _, err := c.ServerInfoService.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{})); err != nil {
		t.Fatal(err)
	}
	if proto != "h2" {
		t.Errorf("negotiated protocol %q, want h2", proto)
	}
}

func TestClientWithoutCertificate(t *testing.T) {
	env := ctrltest.New(t, ctrltest.Options{})
	c, err := kibotos.NewClient(env.URL, kibotos.WithTLSFiles(env.PKI.CA, "", ""))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ServerInfoService.GetServerInfo(t.Context(), connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("GetServerInfo without a certificate = %v, want unauthenticated", err)
	}
	if _, ok := kibotos.Detail(err); !ok {
		t.Errorf("GetServerInfo without a certificate: no ErrorDetail in %v", err)
	}
}

func TestNewClientHostPort(t *testing.T) {
	f := newFakeCtrl(capability.EgressManage)
	srv := serveFake(t, f)
	hostPort := strings.TrimPrefix(srv.URL, "https://")
	c, err := kibotos.NewClient(hostPort, kibotos.WithHTTPClient(srv.Client()))
	if err != nil {
		t.Fatalf("NewClient(%q) = %v", hostPort, err)
	}
	if c.Endpoint() != srv.URL {
		t.Errorf("Endpoint() = %q, want %q", c.Endpoint(), srv.URL)
	}
	if _, err := c.ServerInfo(t.Context()); err != nil {
		t.Errorf("GetServerInfo over %q = %v", hostPort, err)
	}
}

func TestNewClientErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name     string
		endpoint string
		opts     []kibotos.Option
	}{
		{"no host", "https://", nil},
		{"no port, no scheme", "", nil},
		{"wrong scheme", "ftp://ctrl.example", nil},
		{"missing CA file", "https://ctrl.example", []kibotos.Option{kibotos.WithTLSFiles(dir+"/nope.pem", "", "")}},
		{"cert without key", "https://ctrl.example", []kibotos.Option{kibotos.WithTLSFiles("", dir+"/c.pem", "")}},
		{"http client and TLS files", "https://ctrl.example", []kibotos.Option{kibotos.WithHTTPClient(http.DefaultClient), kibotos.WithTLSFiles("", "", "")}},
		{"TLS files and TLS config", "https://ctrl.example", []kibotos.Option{kibotos.WithTLSConfig(&tls.Config{}), kibotos.WithTLSFiles("", "", "")}},
		{"nil TLS config", "https://ctrl.example", []kibotos.Option{kibotos.WithTLSConfig(nil)}},
		{"bad wait backoff", "https://ctrl.example", []kibotos.Option{kibotos.WithWaitBackoff(0, 0)}},
	}
	for _, tt := range tests {
		if _, err := kibotos.NewClient(tt.endpoint, tt.opts...); err == nil {
			t.Errorf("%s: NewClient(%q) = nil error, want one", tt.name, tt.endpoint)
		}
	}
}
