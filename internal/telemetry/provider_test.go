package telemetry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/toolnexus/operator/internal/telemetry"
)

func TestProviderFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantOn  bool
		wantErr string
	}{
		{name: "nothing set: off"},
		{name: "an endpoint: on", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, wantOn: true},
		{name: "a traces endpoint: on", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, wantOn: true},
		{name: "otlp without an endpoint: on, to the default", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, wantOn: true},
		{name: "the SDK disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}},
		{name: "none wins over an endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}},
		{name: "another exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: `OTEL_TRACES_EXPORTER="zipkin" is not supported`},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			wantErr: `OTEL_EXPORTER_OTLP_PROTOCOL="grpc" is not supported`},
		{name: "http/protobuf", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, wantOn: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, name := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
				"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
				t.Setenv(name, tc.env[name])
			}
			tp, err := telemetry.ProviderFromEnv(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (tp != nil) != tc.wantOn {
				t.Fatalf("traces on = %t, want %t", tp != nil, tc.wantOn)
			}
			if tp != nil {
				if err := tp.Shutdown(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
