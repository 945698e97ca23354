package v1alpha1_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// httpTool and mcpServer are the one-item lists that carry a timeout into fullRun.
func httpTool(timeout string) map[string]any {
	return map[string]any{"spec.tools": []any{
		map[string]any{"name": "lookup", "http": map[string]any{"url": "http://a", "timeout": timeout}},
	}}
}

func mcpServer(timeout string) map[string]any {
	return map[string]any{"spec.mcpServers": []any{
		map[string]any{"name": "kb", "url": "http://kb", "timeout": timeout},
	}}
}

var _ = Describe("AgentRun duration maxima", func() {
	DescribeTable("accept a duration up to its maximum and refuse one past it, saying the maximum",
		func(edits map[string]any, wantMessage string) {
			err := k8sClient.Create(ctx, object(fullRun, newNamespace(), edits))
			if wantMessage == "" {
				Expect(err).NotTo(HaveOccurred())
				return
			}
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(wantMessage))
		},
		Entry("model.requestTimeout at 10m", map[string]any{"spec.model.requestTimeout": "10m"}, ""),
		Entry("model.requestTimeout at 600s", map[string]any{"spec.model.requestTimeout": "600s"}, ""),
		Entry("model.requestTimeout past 10m", map[string]any{"spec.model.requestTimeout": "10m1s"},
			"spec.model.requestTimeout: Invalid value: \"10m1s\": model.requestTimeout must be at most 10m"),
		Entry("model.requestTimeout of an hour", map[string]any{"spec.model.requestTimeout": "1h"},
			"model.requestTimeout must be at most 10m"),
		Entry("http tool timeout at 10m", httpTool("10m"), ""),
		Entry("http tool timeout past 10m", httpTool("601s"),
			"spec.tools[0].http.timeout: Invalid value: \"601s\": tools[].http.timeout must be at most 10m"),
		Entry("MCP server timeout at 10m", mcpServer("9m60s"), ""),
		Entry("MCP server timeout past 10m", mcpServer("11m"),
			"spec.mcpServers[0].timeout: Invalid value: \"11m\": mcpServers[].timeout must be at most 10m"),
		Entry("suspension.timeout at 30 days", map[string]any{"spec.suspension.timeout": "720h"}, ""),
		Entry("suspension.timeout past 30 days", map[string]any{"spec.suspension.timeout": "720h1s"},
			"spec.suspension.timeout: Invalid value: \"720h1s\": suspension.timeout must be at most 720h (30 days)"),
		// The pattern lets it through; CEL cannot convert it, and says which rule failed.
		Entry("a duration too large to parse", map[string]any{"spec.suspension.timeout": "99999999999h"},
			"evaluating rule: suspension.timeout must be at most 720h (30 days)"),
		Entry("suspension.timeout of a year", map[string]any{"spec.suspension.timeout": "8760h"},
			"suspension.timeout must be at most 720h (30 days)"),
	)
})
