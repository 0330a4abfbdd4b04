package dataplane

import "os"

const loaderEnv = "SHINKEN_TEST_LOADER"

// loaderMain is a stand-in agent process for the adoption test: it opens the
// dataplane named by the environment and exits without uninstalling.
func loaderMain() {
	d, err := Open(Config{Parent: os.Getenv("SHINKEN_TEST_PARENT"), PinPath: os.Getenv("SHINKEN_TEST_PIN"),
		MaxSessions: 1024, MaxHandles: 4096, MaxEgress4: 1 << 16, MaxEgress6: 1 << 16})
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	d.Close()
	os.Exit(0)
}
