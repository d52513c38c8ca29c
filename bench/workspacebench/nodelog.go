//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"os"
	"time"
)

// nodeStart is the embedded node's "execution started" record: the
// runtime's Start from its first step (layer) to the guest's first answer.
type nodeStart struct {
	Time         time.Time     // when it was logged (the end of Start)
	Setup        time.Duration // layer, cgroup, loop, init shim until kibotos-guest is exec'd
	Total        time.Duration // Setup plus the wait for the guest's first answer
	LayerCreated bool
}

// begin is when the runtime's Start began its work.
func (n nodeStart) begin() time.Time { return n.Time.Add(-n.Total) }

// nodeStop is the node's "execution stopped" record.
type nodeStop struct {
	Time        time.Time
	Force       bool
	Writeback   time.Duration // the guest's writeback confirmation
	KillRelease time.Duration // kill, wait for the loop device, remove the cgroup
}

// serverLog is what the benchmark reads back from kibotos-ctrl's JSON log.
type serverLog struct {
	starts map[string]nodeStart // by workspace ID (the last start)
	stops  map[string]nodeStop  // by workspace ID (the last normal stop)
	// createCalls is the server-side duration of CreateWorkspace by command ID.
	createCalls map[string]time.Duration
	// problems are WARN and ERROR records.
	problems []string
	nProblem int
}

func readServerLog(path string) (*serverLog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	l := &serverLog{starts: map[string]nodeStart{}, stops: map[string]nodeStop{}, createCalls: map[string]time.Duration{}}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		b := sc.Bytes()
		if len(b) == 0 || b[0] != '{' {
			continue
		}
		var rec struct {
			Time         time.Time `json:"time"`
			Level        string    `json:"level"`
			Msg          string    `json:"msg"`
			WorkspaceID  string    `json:"workspace_id"`
			Setup        int64     `json:"setup"`
			Total        int64     `json:"total"`
			LayerCreated bool      `json:"layer_created"`
			Force        bool      `json:"force"`
			Writeback    int64     `json:"writeback"`
			KillRelease  int64     `json:"kill_release"`
			Procedure    string    `json:"procedure"`
			DurationMS   float64   `json:"duration_ms"`
			CommandID    string    `json:"command_id"`
		}
		if err := json.Unmarshal(b, &rec); err != nil {
			continue
		}
		switch rec.Msg {
		case "execution started":
			l.starts[rec.WorkspaceID] = nodeStart{Time: rec.Time, Setup: time.Duration(rec.Setup), Total: time.Duration(rec.Total), LayerCreated: rec.LayerCreated}
		case "execution stopped":
			if !rec.Force {
				l.stops[rec.WorkspaceID] = nodeStop{Time: rec.Time, Writeback: time.Duration(rec.Writeback), KillRelease: time.Duration(rec.KillRelease)}
			}
		case "call":
			if rec.Procedure == "/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace" && rec.CommandID != "" {
				l.createCalls[rec.CommandID] = time.Duration(rec.DurationMS * float64(time.Millisecond))
			}
		}
		if rec.Level == "WARN" || rec.Level == "ERROR" {
			l.nProblem++
			if len(l.problems) < 5 {
				l.problems = append(l.problems, string(b))
			}
		}
	}
	return l, sc.Err()
}
