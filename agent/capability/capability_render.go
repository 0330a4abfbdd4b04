package capability

// Decision layer: the capability grammar's renderings: manifest syntax
// (String) and the one-line scope of tables and the panel (Summary).

import (
	"encoding/json"
	"strings"
)

// Summary is the scope in one short line for tables and the panel: a
// net.egress scope as "cidrs and domains ports=P,Q", a net.inbound one as
// "from cidrs ports=P,Q" (its ports are the session's own), any other class
// as its JSON.
func (c Capability) Summary() string {
	if c.Class == ClassNetInbound && c.Inbound != nil {
		parts := make([]string, 0, len(c.Inbound.CIDRs))
		for _, p := range c.Inbound.CIDRs {
			parts = append(parts, p.String())
		}
		s := "from " + strings.Join(parts, ",")
		if len(c.Inbound.Ports) > 0 {
			s += " ports=" + portList(c.Inbound.Ports)
		} else {
			s += " any port"
		}
		return s
	}
	if c.Class == ClassNetEgress && c.Egress != nil {
		parts := make([]string, 0, len(c.Egress.CIDRs)+len(c.Egress.Domains))
		for _, p := range c.Egress.CIDRs {
			parts = append(parts, p.String())
		}
		parts = append(parts, c.Egress.Domains...)
		var ports []string
		for _, p := range c.Egress.Ports {
			ports = append(ports, p.String())
		}
		s := strings.Join(parts, ",")
		if len(ports) > 0 {
			s += " ports=" + strings.Join(ports, ",")
		}
		return s
	}
	b, _ := json.Marshal(c)
	return string(b)
}

func portList(ps []PortRange) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// String renders the capability in manifest syntax.
func (c Capability) String() string {
	c = c.Normalized()
	var f []string
	add := func(k string, v []string) {
		if len(v) > 0 {
			f = append(f, k+"="+strings.Join(v, ","))
		}
	}
	flag := func(k string, v bool) {
		if v {
			f = append(f, k+"=true")
		}
	}
	switch c.Class {
	case ClassNetEgress:
		add("domains", c.Egress.Domains)
		var cs, ps []string
		for _, p := range c.Egress.CIDRs {
			cs = append(cs, p.String())
		}
		for _, p := range c.Egress.Ports {
			ps = append(ps, p.String())
		}
		add("cidrs", cs)
		add("ports", ps)
		flag("tls_inspect", c.Egress.TLSInspect)
	case ClassNetInbound:
		var cs []string
		for _, p := range c.Inbound.CIDRs {
			cs = append(cs, p.String())
		}
		add("cidrs", cs)
		if len(c.Inbound.Ports) > 0 {
			f = append(f, "ports="+portList(c.Inbound.Ports))
		}
	case ClassFSScope:
		add("read", c.FS.Read)
		add("write", c.FS.Write)
		add("deny", c.FS.Deny)
	case ClassClipboard:
		flag("paste_in", c.Clipboard.PasteIn)
		flag("copy_out", c.Clipboard.CopyOut)
	case ClassGPU:
		add("device_ids", c.GPU.DeviceIDs)
		if c.GPU.Mode != "" {
			f = append(f, "mode="+c.GPU.Mode)
		}
	case ClassInstall:
		if c.Install.Scope != "" {
			f = append(f, "scope="+c.Install.Scope)
		}
	case ClassPersistence:
		add("paths", c.Persistence.Paths)
		flag("survives_session", c.Persistence.SurvivesSession)
	case ClassCredentials:
		add("broker_scopes", c.Credentials.BrokerScopes)
	case ClassPeripheral:
		flag("camera", c.Peripheral.Camera)
		flag("mic", c.Peripheral.Mic)
		add("usb", c.Peripheral.USB)
		flag("input_inject", c.Peripheral.InputInject)
	}
	return strings.TrimSpace(string(c.Class) + " " + strings.Join(f, " "))
}
