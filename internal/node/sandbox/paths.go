package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Where a Runtime keeps things. Under Root:
//
//	runtime.json             the cgroup parent and cgroup of this Root (Leaks reads it)
//	layers/<ws>.img          writable layers (<ws>.img.new while one is made)
//	layer-seeds/<bytes>.img  formatted layer seeds, one per capacity (layerseed.go)
//	volumes/<id>.img         Volume images (<id>.img.new while one is made; volume.go)
//	exec/<ws>.json           execution records (state.go)
//	run/<ws>/                per execution: layer/ and root/, the mount points of its shim
//	logs/<ws>.log            the guest's stdout and stderr (and <ws>.log.1, the one before)
//
// and, in each cgroup hierarchy, <CgroupParent>/<root tag>/<ws>.

// layersDir is Root/layers, where the writable layers are.
func (r *Runtime) layersDir() string { return filepath.Join(r.root, "layers") }

// seedDir is Root/layer-seeds, where the layer seeds are.
func (r *Runtime) seedDir() string { return filepath.Join(r.root, seedDirName) }

// execDir is Root/exec, where the execution records are.
func (r *Runtime) execDir() string { return filepath.Join(r.root, "exec") }

// runsDir is Root/run, which holds the run directories.
func (r *Runtime) runsDir() string { return filepath.Join(r.root, "run") }

// layerPath is the writable layer image of ws.
func (r *Runtime) layerPath(ws string) string { return filepath.Join(r.root, "layers", ws+".img") }

// LayerPath is the writable layer image of a workspace.
func (r *Runtime) LayerPath(workspaceID string) string { return r.layerPath(workspaceID) }

// layerTmpPath is where a layer image is made before it is renamed to
// layer.
func layerTmpPath(layer string) string { return layer + ".new" }

// seedPath is the layer seed of capacity bytes in seedDir.
func seedPath(seedDir string, capacity uint64) string {
	return filepath.Join(seedDir, strconv.FormatUint(capacity, 10)+".img")
}

// statePath is the execution record of ws.
func (r *Runtime) statePath(ws string) string { return filepath.Join(r.root, "exec", ws+".json") }

// runDir is Root/run/<ws>, the run directory of ws.
func (r *Runtime) runDir(ws string) string { return filepath.Join(r.root, "run", ws) }

// logPath is the guest log of ws.
func (r *Runtime) logPath(ws string) string { return filepath.Join(r.root, "logs", ws+".log") }

// LogPath is the guest's log (its stdout and stderr) on the host.
func (r *Runtime) LogPath(workspaceID string) string { return r.logPath(workspaceID) }

// rootTag names a Root in cgroup paths.
func rootTag(root string) string {
	h := sha256.Sum256([]byte(filepath.Clean(root)))
	return hex.EncodeToString(h[:6])
}

// cgroupRel is the cgroup of ws, relative to each hierarchy's root.
func (r *Runtime) cgroupRel(ws string) string { return path.Join(r.cgBase, ws) }

// under reports whether p is dir or inside it.
func under(p, dir string) bool {
	dir = strings.TrimSuffix(dir, "/")
	return p == dir || strings.HasPrefix(p, dir+"/")
}
