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
# The examples are modules of their own (a replace to this repository) that build on pkg/toolnexustest
# the way a user's module does; ./... of this module does not reach them.
EXAMPLES := examples/answer-bot

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
	go vet -tags e2e ./test/e2e/
	go vet -tags chaos ./test/chaos/
	for dir in $(EXAMPLES); do (cd $$dir && go vet ./...) || exit 1; done

.PHONY: lint
lint: golangci-lint helm-lint ## Run golangci-lint, and helm lint the chart.
	$(GOLANGCI_LINT) run ./...
	for dir in $(EXAMPLES); do (cd $$dir && $(GOLANGCI_LINT) run ./...) || exit 1; done

.PHONY: lint-fix
lint-fix: golangci-lint ## Run golangci-lint and apply its fixes.
	$(GOLANGCI_LINT) run --fix ./...

.PHONY: envtest
envtest: ## Build kube-apiserver, etcd and kubectl from Go modules (once) and print their directory.
	@hack/controlplane.sh

.PHONY: test
test: ## Run every suite (test-unit, test-examples, test-e2e, test-chaos) even when one fails; summarise and fail if any failed.
	MAKE="$(MAKE)" hack/test-all.sh test-unit test-examples test-e2e test-chaos

.PHONY: test-unit
test-unit: manifests generate kustomize chromium ## Run the unit and envtest integration tests (go test ./...), test/chart included.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" MCP_EVERYTHING="$$(hack/mcp-everything.sh)" go test $(GO_TEST_FLAGS) ./...

.PHONY: test-examples
test-examples: manifests generate ## Run the examples' suites (their own modules, on pkg/toolnexustest).
	for dir in $(EXAMPLES); do (cd $$dir && KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test $(GO_TEST_FLAGS) ./...) || exit 1; done

FLAKE_RUNS ?= 10
FLAKE_PKGS ?= ./...
FLAKE_FLAGS ?=
.PHONY: test-flakes
test-flakes: manifests generate kustomize chromium ## Run FLAKE_PKGS (default ./...) FLAKE_RUNS times, shuffled with a new seed each run; count failures per test.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" MCP_EVERYTHING="$$(hack/mcp-everything.sh)" go run ./hack/flakes -runs $(FLAKE_RUNS) $(FLAKE_FLAGS) $(FLAKE_PKGS)

# The browser tests (test/inbox, the logins of internal/controller and test/e2e) drive Debian's chromium; as root it is installed when
# missing, otherwise the target stops and names the package.
.PHONY: chromium
chromium: ## Install Debian's chromium package, which the browser tests (inbox, logins) drive, when it is missing.
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	  else echo "The browser tests (test/inbox, the logins) need Debian's chromium package: sudo apt-get install -y chromium" >&2; exit 1; fi; }

.PHONY: inbox-screenshots
inbox-screenshots: manifests generate chromium ## Run the inbox's browser tests and save the README's screenshots into docs/images.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" INBOX_SCREENSHOTS=docs/images go test $(GO_TEST_FLAGS) ./test/inbox/

.PHONY: test-chaos
test-chaos: manifests generate ## Chaos e2e: 100 runs while the manager is SIGKILLed 20+ times, the API server restarts and a leader fails over.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test $(GO_TEST_FLAGS) -tags chaos -timeout 15m -v ./test/chaos/

FUZZTIME ?= 60s
.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (new crashers land in testdata/fuzz).
	for t in tools:FuzzAnswerJSON tools:FuzzRequestJSON tools:FuzzPendingOf tools:FuzzHTTPResponse loop:FuzzStateDecode loop:FuzzValidateAnswer loop:FuzzOpenAIResponse loop:FuzzAnthropicResponse; do \
	  go test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) ./internal/$${t%%:*}/ || exit 1; done

BENCH_FLAGS ?=
.PHONY: bench
bench: manifests generate ## Benchmarks: resume latency, throughput, parked scale, slow models, fairness, 5,000 active runs, hostile inputs, 100 ApprovalPolicies; figures into docs/benchmarks.md. BENCH_FLAGS="-parked=500 -idle=10s -slow-runs=96 -scale=500" for a quick pass.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go run ./hack/bench -doc=docs/benchmarks.md $(BENCH_FLAGS)
	go test ./internal/runstore -run '^$$' -bench 'SaveRecord' -benchmem
	go test ./internal/controller/policy -run '^$$' -bench 'Check100Policies' -benchmem

.PHONY: test-e2e
test-e2e: manifests generate chromium ## Run the e2e tests: built binaries, local control plane, real kubectl, a browser for logins.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test $(GO_TEST_FLAGS) -tags e2e ./test/e2e/

##@ Local

.PHONY: dev
dev: manifests generate ## Run the operator locally for real (kube-apiserver+etcd, CRDs, policies, RBAC, model, sample tools, manager); Ctrl-C stops it.
	hack/dev.sh

.PHONY: demo
demo: manifests generate ## One command: bring up the local stack, suspend a run, answer it with kubectl, see it finish, tear down.
	hack/demo.sh

##@ Build

.PHONY: build
build: manifests generate ## Build the manager binary into bin/.
	go build -o $(LOCALBIN)/manager ./cmd/manager

.PHONY: build-plugin
build-plugin: ## Build the kubectl plugin into bin/kubectl-toolnexus (put it on PATH: kubectl toolnexus).
	go build -o $(LOCALBIN)/kubectl-toolnexus ./cmd/kubectl-toolnexus

.PHONY: docker-build
docker-build: ## Build the manager image IMG (needs a Docker engine).
	docker build -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the manager image IMG.
	docker push $(IMG)

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

##@ Deployment (kustomize)

KUSTOMIZE ?= $(LOCALBIN)/kustomize
# v5.8.2 (kustomize/api v0.21.2) is the newest kustomize that builds with Go 1.26; v5.8.3 needs Go 1.27.
KUSTOMIZE_VERSION ?= v5.8.2
# The manager image that deploy, deploy-namespaced and build-installer put into the Deployment.
IMG ?= controller:latest
# The namespace deploy-namespaced confines the manager to; it must exist.
WATCH_NAMESPACE ?= agents

.PHONY: build-installer
build-installer: manifests kustomize ## Write dist/install.yaml: everything config/default deploys, with the image IMG.
	mkdir -p dist
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default > dist/install.yaml

.PHONY: deploy
deploy: manifests kustomize ## Deploy the operator (image IMG) to the cluster of the current KUBECONFIG.
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: kustomize ## Remove what deploy deployed, CRDs included (and with them every AgentRun and PendingRequest).
	$(KUSTOMIZE) build config/default | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: deploy-namespaced
deploy-namespaced: manifests kustomize ## Deploy the operator (image IMG) confined to the existing namespace WATCH_NAMESPACE.
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	cd config/namespaced/watched && $(KUSTOMIZE) edit set namespace $(WATCH_NAMESPACE)
	$(KUSTOMIZE) build config/namespaced | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy-namespaced
undeploy-namespaced: kustomize ## Remove what deploy-namespaced deployed (the watched namespace stays).
	$(KUSTOMIZE) build config/namespaced | $(KUBECTL) delete --ignore-not-found -f -

##@ Tools

$(LOCALBIN):
	mkdir -p $(LOCALBIN)

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN): | $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

.PHONY: kustomize
kustomize: $(KUSTOMIZE)
$(KUSTOMIZE): | $(LOCALBIN)
	$(call go-install-tool,$(KUSTOMIZE),sigs.k8s.io/kustomize/kustomize/v5,$(KUSTOMIZE_VERSION))

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

##@ Helm chart

HELM ?= $(LOCALBIN)/helm
HELM_VERSION ?= v4.3.1
CHART ?= charts/toolnexus-operator

.PHONY: chart
chart: manifests kustomize ## Copy the CRDs into the chart and regenerate its RBAC, admission policies, ServiceMonitor and NetworkPolicy from config/.
	rm -f $(CHART)/crds/*.yaml && cp config/crd/bases/*.yaml $(CHART)/crds/
	$(KUSTOMIZE) build config/default | go run ./hack/chartgen -from config/default -kinds ServiceAccount,Role,RoleBinding,ClusterRole,ClusterRoleBinding > $(CHART)/templates/rbac.yaml
	$(KUSTOMIZE) build config/default | go run ./hack/chartgen -from config/default -kinds ValidatingAdmissionPolicy,ValidatingAdmissionPolicyBinding,MutatingAdmissionPolicy,MutatingAdmissionPolicyBinding > $(CHART)/templates/policies.yaml
	$(KUSTOMIZE) build config/prometheus | go run ./hack/chartgen -from config/prometheus -when .Values.serviceMonitor.enabled > $(CHART)/templates/servicemonitor.yaml
	$(KUSTOMIZE) build config/network-policy | go run ./hack/chartgen -from config/network-policy -when .Values.networkPolicy.enabled > $(CHART)/templates/networkpolicy.yaml

.PHONY: helm-lint
helm-lint: helm ## helm lint the chart, and render it with every optional object switched on.
	$(HELM) lint --strict $(CHART)
	$(HELM) template toolnexus $(CHART) -n toolnexus-system --set serviceMonitor.enabled=true,networkPolicy.enabled=true,namespace.create=true >/dev/null

.PHONY: test-chart
test-chart: ## The chart renders what config/default renders (Helm SDK, kustomize API), the krew manifest has its shape.
	go test $(GO_TEST_FLAGS) ./test/chart/

.PHONY: helm
helm: $(HELM)
$(HELM): | $(LOCALBIN)
	$(call go-install-tool,$(HELM),helm.sh/helm/v4/cmd/helm,$(HELM_VERSION))
