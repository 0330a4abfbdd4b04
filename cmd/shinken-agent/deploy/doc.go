// Package deploy holds no code: it is where the files that deploy and
// observe shinken-agent live, next to the daemon they describe (the
// repository's top level is fixed, and these belong to the daemon as much as
// its systemd unit, cmd/shinken-agent/shinken-agent.service, does):
//
//	prometheus/alerts.yml           alerting rules (CI: promtool check rules)
//	prometheus/scrape.yml           a scrape job for a Prometheus on the node
//	grafana/shinken-agent.json      a Grafana dashboard
//	kubernetes/shinken-agent.yaml   a DaemonSet with the host mounts and
//	                                capabilities the agent needs, a metrics
//	                                proxy and a PodMonitor
//
// Its tests decode the Kubernetes objects strictly into the API types and
// check that the rules and the dashboard name only metrics the code exports.
package deploy
