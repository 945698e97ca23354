package v1alpha1_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// The admission policy toolnexus-answer-rules refuses answers stamped after spec.request.expiresAt;
// it can only do so for a value it can read, so the CRD admits nothing else.
var _ = Describe("PendingRequest expiresAt", func() {
	const wrongShape = "spec.request.expiresAt must be an RFC 3339 date-time from 1970 on, with seconds and a zone"

	DescribeTable("admits an RFC 3339 date-time and refuses anything else, saying what it needs",
		func(expiresAt, wantMessage string) {
			err := k8sClient.Create(ctx, object(request, newNamespace(), map[string]any{"spec.request.expiresAt": expiresAt}))
			if wantMessage == "" {
				Expect(err).NotTo(HaveOccurred())
				return
			}
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring("spec.request.expiresAt: Invalid value"))
			Expect(err.Error()).To(ContainSubstring(wantMessage))
		},
		Entry("UTC", "2026-12-01T00:00:00Z", ""),
		Entry("an offset and fractional seconds", "2026-12-01T01:00:00.125+01:00", ""),
		Entry("February 29 of a leap year", "2028-02-29T12:00:00Z", ""),
		Entry("a word", "tomorrow", wrongShape),
		Entry("empty", "", wrongShape),
		Entry("no zone", "2026-12-01T00:00:00", wrongShape),
		Entry("a space for T", "2026-12-01 00:00:00Z", wrongShape),
		Entry("lower-case t and z", "2026-12-01t00:00:00z", wrongShape),
		Entry("no seconds", "2026-12-01T00:00Z", wrongShape),
		Entry("hour 24", "2026-12-01T24:00:00Z", wrongShape),
		Entry("month 13", "2026-13-01T00:00:00Z", wrongShape),
		Entry("before 1970", "1969-12-31T23:59:59Z", wrongShape),
		// The pattern lets it through; the conversion cannot, and says which rule failed.
		Entry("February 30", "2026-02-30T00:00:00Z", "evaluating rule: "+wrongShape),
		Entry("February 29 of another year", "2026-02-29T00:00:00Z", "evaluating rule: "+wrongShape),
	)
})
