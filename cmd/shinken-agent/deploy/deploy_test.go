package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// podMonitor is the subset of prometheus-operator's monitoring.coreos.com/v1
// PodMonitor this repository uses: an offline schema (the operator's Go
// types would pull in the operator), decoded as strictly as the rest.
type podMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		JobLabel  string               `json:"jobLabel"`
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port      string `json:"port"`
			Path      string `json:"path"`
			Scheme    string `json:"scheme"`
			Interval  string `json:"interval"`
			TLSConfig struct {
				InsecureSkipVerify bool `json:"insecureSkipVerify"`
			} `json:"tlsConfig"`
			Authorization struct {
				Type        string                   `json:"type"`
				Credentials corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// objects decodes every document of the manifest strictly into its API type.
func objects(t *testing.T) (map[string]any, string) {
	raw, err := os.ReadFile("kubernetes/shinken-agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Namespace":
			obj = &corev1.Namespace{}
		case "v1 ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Secret":
			obj = &corev1.Secret{}
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "apps/v1 DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "monitoring.coreos.com/v1 PodMonitor":
			obj = &podMonitor{}
		default:
			t.Fatalf("document %d: unexpected %s %s", i, tm.APIVersion, tm.Kind)
		}
		// As the API server decodes: field names case-sensitive, unknown
		// fields and duplicate keys errors.
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatalf("document %d (%s): %v", i, tm.Kind, err)
		}
		strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err != nil || len(strict) > 0 {
			t.Fatalf("document %d (%s): %v %v", i, tm.Kind, err, strict)
		}
		name := regexp.MustCompile(`(?m)^  name: (\S+)`).FindStringSubmatch(doc)
		if name == nil {
			t.Fatalf("document %d (%s) has no name", i, tm.Kind)
		}
		key := tm.Kind + "/" + name[1]
		if _, dup := out[key]; dup {
			t.Fatalf("%s twice", key)
		}
		out[key] = obj
	}
	return out, string(raw)
}

func TestKubernetesManifest(t *testing.T) {
	objs, raw := objects(t)
	ds, ok := objs["DaemonSet/shinken-agent"].(*appsv1.DaemonSet)
	if !ok {
		t.Fatalf("no DaemonSet in %v", objs)
	}
	pod := ds.Spec.Template.Spec
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template", k, v)
		}
	}
	if !pod.HostNetwork || !pod.HostPID || pod.HostIPC {
		t.Errorf("host namespaces: network %v pid %v ipc %v (want network and pid only)", pod.HostNetwork, pod.HostPID, pod.HostIPC)
	}
	if sa, ok := objs["ServiceAccount/"+pod.ServiceAccountName]; !ok || sa == nil {
		t.Errorf("service account %q not in the manifest", pod.ServiceAccountName)
	}

	var agent *corev1.Container
	for i := range pod.Containers {
		if pod.Containers[i].Name == "agent" {
			agent = &pod.Containers[i]
		}
	}
	if agent == nil {
		t.Fatal("no agent container")
	}
	sc := agent.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil {
		t.Fatal("the agent container must not be privileged and must list its capabilities")
	}
	var add []string
	for _, c := range sc.Capabilities.Add {
		add = append(add, string(c))
	}
	sort.Strings(add)
	want := []string{"BPF", "CHOWN", "KILL", "MKNOD", "NET_ADMIN", "PERFMON", "SETGID", "SETPCAP", "SETUID", "SYS_ADMIN", "SYS_CHROOT"}
	if !slices.Equal(add, want) || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("capabilities: drop %v add %v, want drop [ALL] add %v", sc.Capabilities.Drop, add, want)
	}
	// The API server's own rule (ValidateSecurityContext): no SYS_ADMIN (or
	// privileged) with allowPrivilegeEscalation false.
	if ape := sc.AllowPrivilegeEscalation; ape != nil && !*ape && slices.Contains(add, "SYS_ADMIN") {
		t.Error("allowPrivilegeEscalation false with SYS_ADMIN: the API server refuses it")
	}
	// Each capability says why, in a comment on its line.
	for _, c := range want {
		if !regexp.MustCompile(`(?m)^\s+- ` + c + `\s+#\s*\S`).MatchString(raw) {
			t.Errorf("capability %s has no comment saying why", c)
		}
	}

	// Exactly these host paths, each mounted into the agent.
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	wantPaths := map[string]string{"bpffs": "/sys/fs/bpf", "cgroup": "/sys/fs/cgroup", "state": "/var/lib/shinken", "run": "/run/shinken"}
	if len(hostPaths) != len(wantPaths) {
		t.Errorf("host paths %v, want %v", hostPaths, wantPaths)
	}
	mounted := map[string]string{}
	for _, m := range agent.VolumeMounts {
		mounted[m.Name] = m.MountPath
	}
	for name, p := range wantPaths {
		if hostPaths[name] != p || mounted[name] != p {
			t.Errorf("volume %s: host path %q mounted at %q, want %s at the same place", name, hostPaths[name], mounted[name], p)
		}
	}
	for _, c := range pod.Containers {
		if c.Name == "agent" {
			continue
		}
		for _, m := range c.VolumeMounts {
			if _, ok := hostPaths[m.Name]; ok {
				t.Errorf("container %s mounts host path %s", c.Name, m.Name)
			}
		}
		if c.SecurityContext == nil || c.SecurityContext.RunAsNonRoot == nil || !*c.SecurityContext.RunAsNonRoot {
			t.Errorf("container %s runs as root", c.Name)
		}
	}

	// The PodMonitor finds the pods and a port by that name, and names the job
	// the rules and the dashboard use.
	pm, ok := objs["PodMonitor/shinken-agent"].(*podMonitor)
	if !ok {
		t.Fatal("no PodMonitor")
	}
	for k, v := range pm.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("PodMonitor selector %s=%s does not match the pods", k, v)
		}
	}
	if ds.Spec.Template.Labels[pm.Spec.JobLabel] != "shinken-agent" {
		t.Errorf("jobLabel %q does not make the job shinken-agent", pm.Spec.JobLabel)
	}
	for _, ep := range pm.Spec.Endpoints {
		found := false
		for _, c := range pod.Containers {
			for _, p := range c.Ports {
				found = found || p.Name == ep.Port
			}
		}
		if !found {
			t.Errorf("PodMonitor port %q is no container port", ep.Port)
		}
		if _, ok := objs["Secret/"+ep.Authorization.Credentials.Name]; !ok {
			t.Errorf("PodMonitor credentials secret %q not in the manifest", ep.Authorization.Credentials.Name)
		}
	}
	cm, _ := objs["ConfigMap/shinken-agent-config"].(*corev1.ConfigMap)
	if cm == nil {
		t.Fatal("no ConfigMap")
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(cm.Data["agent.json"]), &cfg); err != nil {
		t.Errorf("agent.json: %v", err)
	}
	if cfg["metrics_addr"] != "127.0.0.1:9464" {
		t.Errorf("metrics_addr %v: the proxy expects 127.0.0.1:9464", cfg["metrics_addr"])
	}
}

// exported collects the metric names the code exports.
func exported(t *testing.T) map[string]bool {
	names := map[string]bool{}
	re := regexp.MustCompile(`"(shinken_[a-z0-9_]+)"`)
	var files []string
	for _, g := range []string{"../../../agent/metrics/*.go", "../../../dnsresolver/*.go", "../*.go"} {
		m, _ := filepath.Glob(g)
		files = append(files, m...)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %d metric names in the code: %v", len(names), names)
	}
	return names
}

func usedMetrics(t *testing.T, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var out []string
	for _, m := range regexp.MustCompile(`shinken_[a-z0-9_]+`).FindAllString(string(b), -1) {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	return out
}

func TestMetricNames(t *testing.T) {
	have := exported(t)
	for _, f := range []string{"prometheus/alerts.yml", "grafana/shinken-agent.json"} {
		used := usedMetrics(t, f)
		for _, m := range used {
			base := m
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(m, suf); ok && have[b] {
					base = b
				}
			}
			if !have[base] {
				t.Errorf("%s names %s, which the code does not export", f, m)
			}
		}
		if len(used) < 5 {
			t.Errorf("%s names only %v", f, used)
		}
	}
}

func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/shinken-agent.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			GridPos struct{ X, Y, W, H int }
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	ids := map[int]bool{}
	all := ""
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("panel %q: grid %+v", p.Title, p.GridPos)
		}
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.Expr == "" || q.RefID == "" || strings.Count(q.Expr, "(") != strings.Count(q.Expr, ")") {
				t.Errorf("panel %q: query %+v", p.Title, q)
			}
			all += q.Expr + "\n"
		}
	}
	// What issue 11 asks the dashboard to show.
	for _, want := range []string{"sum by (class, reason) (rate(shinken_denials_total", "topk(10, sum by (session)", "shinken_revoke_duration_seconds_bucket",
		"shinken_decision_duration_seconds_bucket", "shinken_dns_queries_total", "shinken_map_entries_limit"} {
		if !strings.Contains(all, want) {
			t.Errorf("dashboard lacks %s", want)
		}
	}
}
