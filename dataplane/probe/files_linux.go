//go:build linux

package probe

import (
	"golang.org/x/sys/unix"
)

// fileCmd serves the file commands (fs.scope tests), each with raw system
// calls so the errno is the kernel's:
//
//	fopen N PATH r|w|rw   open PATH and keep the descriptor as N
//	fread N               pread one byte at 0 from N
//	fwrite N              pwrite one byte at 0 to N
//	fclose N              close N
//	cat PATH              open read-only and read one byte
//	put PATH              open write-only, creating (0666) and truncating, and write one byte
//	append PATH           open write-only for append (no create) and write one byte
//	truncate PATH         truncate(2) to 0
//	mkdir PATH | rmdir PATH | unlink PATH
//	rename OLD NEW | link OLD NEW | symlink TARGET PATH
func (p *prober) fileCmd(f []string) (string, bool) {
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	one := []byte{'x'}
	switch f[0] {
	case "fopen":
		flags := unix.O_RDONLY
		switch arg(3) {
		case "w":
			flags = unix.O_WRONLY
		case "rw":
			flags = unix.O_RDWR
		}
		fd, err := unix.Open(arg(2), flags|unix.O_CLOEXEC, 0)
		if err == nil {
			p.socks[arg(1)] = fd
		}
		return result("", err), true
	case "fread", "fwrite", "fclose":
		fd, ok := p.socks[arg(1)]
		if !ok {
			return "err no such descriptor", true
		}
		var err error
		switch f[0] {
		case "fread":
			_, err = unix.Pread(fd, one, 0)
		case "fwrite":
			_, err = unix.Pwrite(fd, one, 0)
		default:
			delete(p.socks, arg(1))
			err = unix.Close(fd)
		}
		return result("", err), true
	case "cat", "put", "append":
		flags := unix.O_RDONLY
		if f[0] == "put" {
			flags = unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC
		} else if f[0] == "append" {
			flags = unix.O_WRONLY | unix.O_APPEND
		}
		fd, err := unix.Open(arg(1), flags|unix.O_CLOEXEC, 0o666)
		if err != nil {
			return result("", err), true
		}
		defer unix.Close(fd)
		if f[0] == "cat" {
			_, err = unix.Read(fd, one)
		} else {
			_, err = unix.Write(fd, one)
		}
		return result("", err), true
	case "truncate":
		return result("", unix.Truncate(arg(1), 0)), true
	case "mkdir":
		return result("", unix.Mkdir(arg(1), 0o777)), true
	case "rmdir":
		return result("", unix.Rmdir(arg(1))), true
	case "unlink":
		return result("", unix.Unlink(arg(1))), true
	case "rename":
		return result("", unix.Rename(arg(1), arg(2))), true
	case "link":
		return result("", unix.Link(arg(1), arg(2))), true
	case "symlink":
		return result("", unix.Symlink(arg(1), arg(2))), true
	}
	return "", false
}
