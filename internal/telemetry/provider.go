package telemetry

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// DefaultServiceName names the manager in traces unless OTEL_SERVICE_NAME does.
const DefaultServiceName = "toolnexus-operator"

// maxAttributeLen bounds a string attribute (a prompt, a tool's output) unless
// OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT says otherwise.
const maxAttributeLen = 64 << 10

// NewProvider is a tracer provider that gives run spans their derived ids; opts add the exporter
// and the resource.
func NewProvider(opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	limits := sdktrace.NewSpanLimits()
	if limits.AttributeValueLengthLimit < 0 {
		limits.AttributeValueLengthLimit = maxAttributeLen
	}
	return sdktrace.NewTracerProvider(append(opts, sdktrace.WithIDGenerator(idGenerator{}), sdktrace.WithRawSpanLimits(limits))...)
}

// ProviderFromEnv configures tracing from the standard OpenTelemetry environment: traces are on
// when OTEL_TRACES_EXPORTER is otlp, or when it is unset and OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; they are sent over OTLP/HTTP (protobuf), and the
// exporter reads the rest of its OTEL_EXPORTER_OTLP_* settings itself. OTEL_SDK_DISABLED=true
// turns them off whatever else is set. It returns nil when traces are off.
func ProviderFromEnv(ctx context.Context) (*sdktrace.TracerProvider, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	switch exporter := os.Getenv("OTEL_TRACES_EXPORTER"); exporter {
	case "none":
		return nil, nil
	case "":
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported: use otlp or none", exporter)
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if p := os.Getenv(name); p != "" && p != "http/protobuf" {
			return nil, fmt.Errorf("%s=%q is not supported: traces are sent as http/protobuf", name, p)
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("the OTLP trace exporter: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES come last, so they win.
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName(DefaultServiceName)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("the trace resource: %w", err)
	}
	return NewProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
