package sandbox

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

// ReadStat returns the state letter (field 3: R, S, D, T, Z…) and the
// start time (field 22: clock ticks after boot) from a /proc stat file,
// "pid (comm) S ppid … starttime …". ok is false when there is no such
// file or it is malformed. The command name may hold spaces and
// parentheses, so the fields are counted from the last ')'. A PID alone
// may be reused by another process once its own has died; PID and start
// time together may not, which is what the backends tell a process by.
func ReadStat(path string) (state byte, start uint64, ok bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return 0, 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil || len(f[0]) != 1 {
		return 0, 0, false
	}
	return f[0][0], start, true
}
