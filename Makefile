# Toolnexus Operator. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint

CONTROLLER_TOOLS_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION ?= v2.15.0

# The control plane (kube-apiserver, etcd, kubectl) is built from Go modules once and cached where
# setup-envtest keeps binaries; see hack/controlplane.sh.
ENVTEST_ASSETS = $(shell hack/controlplane.sh)
GO_TEST_FLAGS ?= -count=1

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate the CRDs and the manager's RBAC role from the API types and markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object paths="./api/..."

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet (including the e2e sources).
	go vet ./...
	go vet -tags e2e ./test/...

.PHONY: lint
lint: golangci-lint ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

.PHONY: lint-fix
lint-fix: golangci-lint ## Run golangci-lint and apply its fixes.
	$(GOLANGCI_LINT) run --fix ./...

.PHONY: envtest
envtest: ## Build kube-apiserver, etcd and kubectl from Go modules (once) and print their directory.
	@hack/controlplane.sh

.PHONY: test
test: manifests generate ## Run every test: unit, envtest integration and e2e.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" MCP_EVERYTHING="$$(hack/mcp-everything.sh)" go test $(GO_TEST_FLAGS) ./...

##@ Build

.PHONY: build
build: manifests generate ## Build the manager binary into bin/.
	go build -o $(LOCALBIN)/manager ./cmd/manager

##@ Deployment

KUBECTL ?= $(ENVTEST_ASSETS)/kubectl

.PHONY: install
install: manifests ## Install the CRDs, admission policies and RBAC into the cluster of the current KUBECONFIG.
	$(KUBECTL) apply --server-side -f config/crd/bases
	$(KUBECTL) create namespace toolnexus-system --dry-run=client -o yaml | $(KUBECTL) apply --server-side -f -
	$(KUBECTL) apply --server-side -k config/rbac
	$(KUBECTL) apply --server-side -k config/policies

.PHONY: uninstall
uninstall: manifests ## Remove what install installed (and with the CRDs every AgentRun and PendingRequest).
	$(KUBECTL) delete --ignore-not-found -k config/policies
	$(KUBECTL) delete --ignore-not-found -k config/rbac
	$(KUBECTL) delete --ignore-not-found -f config/crd/bases

##@ Tools

$(LOCALBIN):
	mkdir -p $(LOCALBIN)

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN): | $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT)
$(GOLANGCI_LINT): | $(LOCALBIN)
	$(call go-install-tool,$(GOLANGCI_LINT),github.com/golangci/golangci-lint/v2/cmd/golangci-lint,$(GOLANGCI_LINT_VERSION))

# go-install-tool installs a pinned Go tool into bin/ under a versioned name and links the plain name
# to it, so bumping a version reinstalls.
define go-install-tool
@[ -f "$(1)-$(3)" ] && [ "$$(readlink -- "$(1)" 2>/dev/null)" = "$$(basename $(1))-$(3)" ] || { \
set -e; \
echo "Installing $(2)@$(3)"; \
rm -f "$(1)"; \
GOBIN="$(LOCALBIN)" go install $(2)@$(3); \
mv "$(LOCALBIN)/$$(basename "$(1)")" "$(1)-$(3)"; \
ln -sf "$$(basename $(1))-$(3)" "$(1)"; \
}
endef
