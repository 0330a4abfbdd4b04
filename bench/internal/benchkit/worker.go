package benchkit

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The worker side: a bench runs its own binary as a worker (argv[1]
// "worker"), which reads its mode and counts from its arguments and prints
// name-value lines that the bench reads with ParseLines.

// Line prints a worker's line "NAME V1 V2 ..." (what ParseLines reads).
func Line(name string, ns []int64) {
	var b strings.Builder
	b.WriteString(name)
	for _, v := range ns {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(v, 10))
	}
	fmt.Println(b.String())
}

// WorkerCount parses a worker's count argument (a whole number, 0 or
// more); a bad one ends the worker with status 2.
func WorkerCount(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		fmt.Fprintf(os.Stderr, "worker: bad count %q\n", s)
		os.Exit(2)
	}
	return n
}

// WorkerExit ends a worker: status 0 when err is nil, else err on stderr
// and status 1.
func WorkerExit(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}
