package dataplane

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf/asm"
)

// The handle check (bpf/handle.bpf.h) and the one table it guards.
const (
	handleCheckFunc = "shk_handle_check"
	handlesMap      = "shk_handles"
	useConsume      = 2 // enum shk_use: SHK_USE_CONSUME
)

// TestOnceIsCompareAndSwap checks the committed object, deterministically
// and without root, that an approve-once handle is consumed by one atomic
// compare-and-exchange and by nothing weaker: a read-then-write passes
// TestOnceMeansOnce's race almost always (its window is a few
// instructions), so the race alone cannot tell the two apart. It checks:
//
//   - the handle table (shk_handles) is referenced by shk_handle_check
//     alone, in every program, but for the flow mark (shk_flow_mark, which
//     only reads it) and the revoke user space runs (shk_revoke, which only
//     exchanges the state word for REVOKED): TestFlowMarkWrites holds those
//     two to that; no other code can write a handle's state;
//   - shk_handle_check writes no memory but its own stack and, once, the
//     handle's state word, and that write is a 32-bit BPF_ATOMIC|BPF_CMPXCHG
//     at offsetof(struct shk_handle, state) with ONCE as the expected value
//     (r0) and USED as the new one, whose result (r0) is next compared with
//     ONCE: the use that did not swap is refused;
//   - the hooks that consume (connect4/6, sendmsg4/6) call shk_handle_check
//     with SHK_USE_CONSUME, and each program that does carries that body.
func TestOnceIsCompareAndSwap(t *testing.T) {
	spec, err := loadShk()
	if err != nil {
		t.Fatal(err)
	}
	stateOff := int16(unsafe.Offsetof(shkShkHandle{}.State))

	consumers := map[string]bool{}
	var body asm.Instructions // shk_handle_check, from the first program carrying it
	for name, p := range spec.Programs {
		fns := splitFunctions(p.Instructions)
		for fn, insns := range fns {
			for _, ins := range insns {
				if ins.IsLoadFromMap() && ins.Reference() == handlesMap && fn != handleCheckFunc && fn != flowMarkFunc && fn != revokeProg {
					t.Errorf("program %s: %s references %s; only %s may touch the handle table", name, fn, handlesMap, handleCheckFunc)
				}
			}
		}
		if callsWithUse(p.Instructions, handleCheckFunc, useConsume) {
			consumers[name] = true
			if fns[handleCheckFunc] == nil {
				t.Errorf("program %s consumes handles but carries no %s", name, handleCheckFunc)
			}
		}
		if body == nil {
			body = fns[handleCheckFunc]
		}
	}
	for _, want := range []string{"shk_connect4", "shk_connect6", "shk_sendmsg4", "shk_sendmsg6"} {
		if _, ok := spec.Programs[want]; !ok {
			t.Errorf("no program %s in the object", want)
		} else if !consumers[want] {
			t.Errorf("program %s does not call %s with SHK_USE_CONSUME", want, handleCheckFunc)
		}
	}
	if body == nil {
		t.Fatalf("no program carries %s", handleCheckFunc)
	}
	if err := checkCompareAndSwap(body, stateOff, uint32(HandleOnce), uint32(HandleUsed)); err != nil {
		t.Errorf("%s: %v\n%s", handleCheckFunc, err, body)
	}
}

// splitFunctions cuts a flattened program (its own body, then every
// subprogram it calls) at the symbols that start each function.
func splitFunctions(insns asm.Instructions) map[string]asm.Instructions {
	fns := map[string]asm.Instructions{}
	cur, start := "", 0
	for i, ins := range insns {
		if sym := ins.Symbol(); sym != "" {
			if i > start {
				fns[cur] = insns[start:i]
			}
			cur, start = sym, i
		}
	}
	fns[cur] = insns[start:]
	return fns
}

// callsWithUse: some call to fn in insns has r3 last set (in program order
// before the call) to the constant use.
func callsWithUse(insns asm.Instructions, fn string, use int64) bool {
	for i, ins := range insns {
		if !ins.IsFunctionCall() || ins.Reference() != fn {
			continue
		}
		if v, ok := lastConstant(insns[:i], asm.R3); ok && v == use {
			return true
		}
	}
	return false
}

// lastConstant is the immediate the last instruction of insns that writes
// reg moved into it, if that instruction is a move of an immediate.
func lastConstant(insns asm.Instructions, reg asm.Register) (int64, bool) {
	for i := len(insns) - 1; i >= 0; i-- {
		ins := insns[i]
		if !writesReg(ins, reg) {
			continue
		}
		if isMovImm(ins) {
			return ins.Constant, true
		}
		return 0, false
	}
	return 0, false
}

func isMovImm(ins asm.Instruction) bool {
	return ins.OpCode.Class().IsALU() && ins.OpCode.ALUOp() == asm.Mov && ins.OpCode.Source() == asm.ImmSource
}

// writesReg: ins may set reg (ALU ops and loads into it; a call clobbers
// r0-r5; a cmpxchg writes r0).
func writesReg(ins asm.Instruction, reg asm.Register) bool {
	switch cls := ins.OpCode.Class(); {
	case ins.IsFunctionCall() || ins.IsBuiltinCall() || ins.IsKfuncCall():
		return reg <= asm.R5
	case cls.IsALU(), cls.IsLoad():
		return ins.Dst == reg
	case ins.OpCode.AtomicOp() == asm.CmpXchg:
		return reg == asm.R0
	case ins.OpCode.AtomicOp() != asm.InvalidAtomic:
		return ins.Src == reg // a fetch returns into src (assumed for every atomic)
	}
	return false
}

// checkCompareAndSwap: see TestOnceIsCompareAndSwap.
func checkCompareAndSwap(fn asm.Instructions, stateOff int16, once, used uint32) error {
	var problems []string
	cas := -1
	for i, ins := range fn {
		if !ins.OpCode.Class().IsStore() || ins.Dst == asm.R10 {
			continue
		}
		switch {
		case ins.OpCode.AtomicOp() == asm.CmpXchg && ins.OpCode.Size() == asm.Word && ins.Offset == stateOff:
			if cas >= 0 {
				problems = append(problems, fmt.Sprintf("a second compare-and-exchange at %d", i))
			}
			cas = i
		case ins.OpCode.Mode() == asm.AtomicMode:
			problems = append(problems, fmt.Sprintf("atomic %v at %d is not the 32-bit compare-and-exchange of the state word (offset %d)", ins, i, stateOff))
		default:
			problems = append(problems, fmt.Sprintf("plain store %v at %d: a non-stack write that is not the compare-and-exchange (a read-then-write of the state?)", ins, i))
		}
	}
	if cas < 0 {
		problems = append(problems, fmt.Sprintf("no BPF_ATOMIC|BPF_CMPXCHG on the state word (offset %d)", stateOff))
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	ins := fn[cas]
	if v, ok := lastConstant(fn[:cas], asm.R0); !ok || v != int64(once) {
		problems = append(problems, fmt.Sprintf("the compare-and-exchange's expected value (r0) is not the constant ONCE (%d)", once))
	}
	if v, ok := lastConstant(fn[:cas], ins.Src); !ok || v != int64(used) {
		problems = append(problems, fmt.Sprintf("the compare-and-exchange's new value (%v) is not the constant USED (%d)", ins.Src, used))
	}
	if !resultComparedWith(fn[cas+1:], int64(once)) {
		problems = append(problems, fmt.Sprintf("the compare-and-exchange's result (r0) is not next compared with ONCE (%d): the use that lost is not refused", once))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// resultComparedWith: the first instruction after a cmpxchg that reads or
// writes r0 is a conditional jump comparing r0 with the constant v.
func resultComparedWith(after asm.Instructions, v int64) bool {
	for _, ins := range after {
		op := ins.OpCode
		if op.Class().IsJump() && op.JumpOp() != asm.Ja && op.JumpOp() != asm.Call && op.JumpOp() != asm.Exit && ins.Dst == asm.R0 {
			return op.Source() == asm.ImmSource && ins.Constant == v && (op.JumpOp() == asm.JEq || op.JumpOp() == asm.JNE)
		}
		if writesReg(ins, asm.R0) || usesReg(ins, asm.R0) || op.JumpOp() == asm.Exit {
			return false
		}
	}
	return false
}

// usesReg: ins names reg as an operand (an immediate form's zero src field
// does not count).
func usesReg(ins asm.Instruction, reg asm.Register) bool {
	op := ins.OpCode
	if ins.Dst == reg {
		return true
	}
	switch cls := op.Class(); {
	case cls.IsALU(), cls.IsJump():
		return op.Source() == asm.RegSource && ins.Src == reg
	case cls == asm.LdXClass, cls == asm.StXClass:
		return ins.Src == reg
	}
	return false
}
