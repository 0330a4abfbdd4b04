package dataplane

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/asm"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

const (
	flowMarkFunc = "shk_flow_mark" // bpf/flowmark.bpf.h
	revokeProg   = "shk_revoke"
	flowsMap     = "shk_handle_flows"
)

// TestFlowMarkWrites checks the committed object, without root, that the
// two pieces of code besides shk_handle_check that reference the handle
// table cannot write a handle but as the design says (bpf/flowmark.bpf.h):
//
//   - shk_flow_mark writes only its stack and, with an atomic exchange,
//     a value of shk_handle_flows; its last atomic before each exit is an
//     exchange on its stack (the barrier before the caller reads states);
//   - shk_revoke writes its context and, once, the handle's state word with
//     a 32-bit atomic exchange to REVOKED; it reads the mark after that.
func TestFlowMarkWrites(t *testing.T) {
	spec, err := loadShk()
	if err != nil {
		t.Fatal(err)
	}
	var mark asm.Instructions
	for _, p := range spec.Programs {
		if f := splitFunctions(p.Instructions)[flowMarkFunc]; f != nil {
			mark = f
			break
		}
	}
	if mark == nil {
		t.Fatalf("no program carries %s", flowMarkFunc)
	}
	writes, err := writeTargets(mark, nil)
	if err != nil {
		t.Fatalf("%s: %v\n%s", flowMarkFunc, err, mark)
	}
	fenced := false
	for _, w := range writes {
		switch {
		case w.to == "stack" && w.ins.OpCode.AtomicOp() == asm.Xchg:
			fenced = true
		case w.to == "stack":
		case w.to == "value:"+flowsMap && w.ins.OpCode.AtomicOp() == asm.Xchg:
		default:
			t.Errorf("%s: %v writes %s: only its stack and, by exchange, a mark", flowMarkFunc, w.ins, w.to)
		}
	}
	if !fenced {
		t.Errorf("%s: no exchange on its stack (the barrier)", flowMarkFunc)
	}
	for i, ins := range mark {
		if ins.OpCode.JumpOp() != asm.Exit {
			continue
		}
		for j := i - 1; j >= 0; j-- {
			if a := mark[j]; a.OpCode.Mode() == asm.AtomicMode {
				if a.OpCode.AtomicOp() != asm.Xchg || a.Dst != asm.R10 {
					t.Errorf("%s: the last atomic before the exit at %d is %v, not the barrier", flowMarkFunc, i, a)
				}
				break
			}
		}
	}

	p := spec.Programs[revokeProg]
	if p == nil {
		t.Fatalf("no program %s", revokeProg)
	}
	body := splitFunctions(p.Instructions)[revokeProg]
	writes, err = writeTargets(body, map[asm.Register]string{asm.R1: "ctx"})
	if err != nil {
		t.Fatalf("%s: %v\n%s", revokeProg, err, body)
	}
	stateOff := int16(unsafe.Offsetof(shkShkHandle{}.State))
	xchg := -1
	for _, w := range writes {
		switch {
		case w.to == "ctx" || w.to == "stack":
		case w.to == "value:"+handlesMap && w.ins.OpCode.AtomicOp() == asm.Xchg && w.ins.OpCode.Size() == asm.Word && w.ins.Offset == stateOff && xchg < 0:
			xchg = w.at
			if v, ok := lastConstant(body[:w.at], w.ins.Src); !ok || v != int64(HandleRevoked) {
				t.Errorf("%s: the exchange's new value (%v) is not the constant REVOKED", revokeProg, w.ins.Src)
			}
		default:
			t.Errorf("%s: %v writes %s: only its context and, once, the state word by exchange", revokeProg, w.ins, w.to)
		}
	}
	if xchg < 0 {
		t.Fatalf("%s: no 32-bit exchange of the state word\n%s", revokeProg, body)
	}
	readsMark := false
	for _, ins := range body[xchg+1:] {
		readsMark = readsMark || ins.OpCode.Class().IsLoad() && ins.OpCode.Mode() == asm.MemMode
	}
	if !readsMark {
		t.Errorf("%s: no load after the exchange: the mark must be read after the state word is written", revokeProg)
	}
}

type writeTarget struct {
	at  int
	ins asm.Instruction
	to  string // "stack", "ctx", "value:<map>"
}

// writeTargets follows, in program order, which registers hold the stack
// frame, the context (entry) or a pointer a map lookup returned, and names
// what each store or atomic writes. A write through a register of unknown
// provenance is an error: the function changed shape, and the test must be
// taught (it fails closed). Program order stands for the flow of control,
// which holds for the straight-line uses of each pointer these functions
// make.
func writeTargets(fn asm.Instructions, entry map[asm.Register]string) ([]writeTarget, error) {
	origin := map[asm.Register]string{asm.R10: "stack"}
	for r, o := range entry {
		origin[r] = o
	}
	mapPtr := map[asm.Register]string{}
	var out []writeTarget
	for i, ins := range fn {
		op := ins.OpCode
		switch {
		case ins.IsLoadFromMap():
			mapPtr[ins.Dst] = ins.Reference()
			delete(origin, ins.Dst)
			continue
		case ins.IsBuiltinCall() && ins.Constant == int64(asm.FnMapLookupElem):
			m := mapPtr[asm.R1]
			for r := asm.R0; r <= asm.R5; r++ {
				delete(origin, r)
				delete(mapPtr, r)
			}
			if m != "" {
				origin[asm.R0] = "value:" + m
			}
			continue
		case op.Class().IsALU() && op.ALUOp() == asm.Mov && op.Source() == asm.RegSource && op.Class() == asm.ALU64Class:
			if o, ok := origin[ins.Src]; ok {
				origin[ins.Dst] = o
			} else {
				delete(origin, ins.Dst)
			}
			delete(mapPtr, ins.Dst)
			continue
		case op.Class().IsStore():
			o, ok := origin[ins.Dst]
			if !ok {
				return nil, fmt.Errorf("write %v at %d through a register of unknown provenance", ins, i)
			}
			out = append(out, writeTarget{at: i, ins: ins, to: o})
		}
		for r := asm.R0; r <= asm.R9; r++ {
			if writesReg(ins, r) {
				delete(origin, r)
				delete(mapPtr, r)
			}
		}
	}
	return out, nil
}

// TestFlowMarks (sweep mode): a revoke sweeps only where a flow may be open
// under the handle. A grant never used is revoked with no sweep; a flow
// handed from one grant to another covering the same peer is cut by the
// second grant's revoke (the sweep that kept it alive marked that grant);
// a flow under a child is cut by its ancestor's revoke; the marks survive
// a restart; and an agent that finds handles but no marks (an older
// version's pins) marks every handle it adopts.
func TestFlowMarks(t *testing.T) {
	cfg := sweepConfig(t)
	d1, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			d1.Uninstall()
		}
	})
	s, _ := d1.CreateSession("fm", Limits{})
	a := listenTCP(t, "127.0.0.2:0")
	b := listenTCP(t, "127.0.0.3:0")
	c := listenTCP(t, "127.0.0.4:0")
	p := startProbe(t, s, ProcOptions{})
	revoke := func(d *Dataplane, h HandleRef) (swept bool) {
		t.Helper()
		before, skipped := d.Ops().Sweeps, d.SweepStats().Skipped
		if err := d.Revoke(h); err != nil {
			t.Fatal(err)
		}
		sw, sk := d.Ops().Sweeps-before, d.SweepStats().Skipped-skipped
		if sw+sk != 1 {
			t.Fatalf("revoke %s: %d sweeps and %d skipped, want one of them", h, sw, sk)
		}
		return sw == 1
	}

	// Never used: no sweep.
	unused := mustHandle(t, d1, HandleRef{}, time.Time{})
	mustAllow(t, d1, "fm", EgressRule{Prefix: pfx("127.0.0.9/32"), Handle: unused})
	if revoke(d1, unused) {
		t.Errorf("the revoke of a grant no flow check tried swept the host")
	}

	// Handed over: h1's rule admits the flow (tried first), h2's covers
	// the same peer.
	h1 := mustHandle(t, d1, HandleRef{}, time.Time{})
	h2 := mustHandle(t, d1, HandleRef{}, time.Time{})
	mustAllow(t, d1, "fm", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: h1})
	mustAllow(t, d1, "fm", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: h2})
	if got := p.Do("open ca tcp " + a.addr()); got != "ok" {
		t.Fatalf("open under h1: %s", got)
	}
	// Under a child: the parent's revoke must sweep.
	parent := mustHandle(t, d1, HandleRef{}, time.Time{})
	child := mustHandle(t, d1, parent, time.Time{})
	mustAllow(t, d1, "fm", EgressRule{Prefix: pfx("127.0.0.3/32"), Handle: child})
	if got := p.Do("open cb tcp " + b.addr()); got != "ok" {
		t.Fatalf("open under the child: %s", got)
	}
	// Marks survive a restart: a used and an unused handle, adopted.
	used := mustHandle(t, d1, HandleRef{}, time.Time{})
	idle := mustHandle(t, d1, HandleRef{}, time.Time{})
	mustAllow(t, d1, "fm", EgressRule{Prefix: pfx("127.0.0.4/32"), Handle: used})
	mustAllow(t, d1, "fm", EgressRule{Prefix: pfx("127.0.0.8/32"), Handle: idle})
	if got := p.Do("open cc tcp " + c.addr()); got != "ok" {
		t.Fatalf("open under used: %s", got)
	}
	d1.Close()
	closed = true
	d := newDataplane(t, cfg)
	if !revoke(d, h1) {
		t.Errorf("the revoke of the grant that admitted a flow did not sweep")
	}
	p.Do("write ca alive")
	expectData(t, a.data, "alive") // h2 covers it still
	if !revoke(d, h2) {
		t.Errorf("the revoke of the grant a sweep kept a flow alive under did not sweep")
	}
	p.Do("write ca cut")
	expectNoData(t, a.data, 500*time.Millisecond)
	if !revoke(d, parent) {
		t.Errorf("the revoke of the parent of a grant that admitted a flow did not sweep")
	}
	p.Do("write cb cut")
	expectNoData(t, b.data, 500*time.Millisecond)
	if revoke(d, idle) {
		t.Errorf("after a restart, the revoke of a grant no flow check tried swept the host")
	}
	if !revoke(d, used) {
		t.Errorf("after a restart, the revoke of a grant that admitted a flow did not sweep")
	}
	p.Do("write cc cut")
	expectNoData(t, c.data, 500*time.Millisecond)
}

// TestFlowMarksAdoptedWithout: a dataplane adopting pins with handles but
// no marks map (an agent from before the marks) marks every handle it
// finds issued, used or not: nothing recorded what flows they admitted.
func TestFlowMarksAdoptedWithout(t *testing.T) {
	kerneltest.RequireRoot(t)
	cfg := testConfig(t)
	d1, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := mustHandle(t, d1, HandleRef{}, time.Time{})
	d1.Close()
	if err := os.Remove(filepath.Join(cfg.PinPath, flowsMap)); err != nil {
		t.Fatal(err)
	}
	d := newDataplane(t, cfg)
	var gen uint32
	if err := d.objs.ShkHandleFlows.Lookup(h.Slot, &gen); err != nil {
		t.Fatal(err)
	}
	if gen != h.Generation {
		t.Errorf("adopted handle %s without marks: mark %d, want its generation", h, gen)
	}
	var other uint32
	if err := d.objs.ShkHandleFlows.Lookup(h.Slot+1, &other); err != nil || other != 0 {
		t.Errorf("a slot never issued: mark %d (%v), want 0", other, err)
	}
}

// TestFlowMarksDeadline (sweep mode): a handle's deadline sweeps only where
// a flow may be open under it. A grant whose deadline passes before its
// first use costs no sweep (counted as skipped); one whose rule admitted a
// flow is swept at its deadline and the flow is cut.
func TestFlowMarksDeadline(t *testing.T) {
	cfg := sweepConfig(t)
	cfg.ExpiryInterval = time.Minute // the collector would free the slots
	d := newDataplane(t, cfg)
	s, _ := d.CreateSession("fd", Limits{})
	a := listenTCP(t, "127.0.0.2:0")
	p := startProbe(t, s, ProcOptions{})
	idleAt := time.Now().Add(400 * time.Millisecond)
	usedAt := idleAt.Add(400 * time.Millisecond)
	idle := mustHandle(t, d, HandleRef{}, idleAt)
	used := mustHandle(t, d, HandleRef{}, usedAt)
	mustAllow(t, d, "fd", EgressRule{Prefix: pfx("127.0.0.9/32"), Handle: idle})
	mustAllow(t, d, "fd", EgressRule{Prefix: pfx("127.0.0.2/32"), Handle: used})
	if got := p.Do("open c tcp " + a.addr()); got != "ok" {
		t.Fatalf("open under used: %s", got)
	}
	drain(a.data)
	before := d.SweepStats()
	time.Sleep(time.Until(idleAt) + 150*time.Millisecond)
	mid := d.SweepStats()
	if mid.Sweeps != before.Sweeps || mid.Skipped != before.Skipped+1 {
		t.Errorf("the deadline of a grant no flow check tried: %d sweeps and %d skipped, want 0 and 1", mid.Sweeps-before.Sweeps, mid.Skipped-before.Skipped)
	}
	p.Do("write c alive")
	expectData(t, a.data, "alive")
	time.Sleep(time.Until(usedAt) + 150*time.Millisecond)
	after := d.SweepStats()
	if after.Sweeps != mid.Sweeps+1 || after.Skipped != mid.Skipped {
		t.Errorf("the deadline of a grant that admitted a flow: %d sweeps and %d skipped, want 1 and 0", after.Sweeps-mid.Sweeps, after.Skipped-mid.Skipped)
	}
	p.Do("write c cut")
	expectNoData(t, a.data, 500*time.Millisecond)
}
