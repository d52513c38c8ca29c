package cli

import (
	"context"
	"io"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/buildinfo"
)

// versionWait bounds the GetServerInfo call of "kibo version": it reports
// the client's revision even when the server does not answer.
const versionWait = 10 * time.Second

// versionInfo is the output of "kibo version".
type versionInfo struct {
	// Client is the source revision kibo was built from.
	Client string `json:"clientRevision"`
	// Server is the server's source_revision, empty when it was not read.
	Server string `json:"serverRevision,omitempty"`
	// ServerError says why the server's revision is missing.
	ServerError string `json:"serverError,omitempty"`
}

func (a *app) versionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show the source revisions of kibo and of the server",
		Long: `Show the source revision kibo was built from and, when the server is
reachable with the connection settings, its source_revision (GetServerInfo,
display only: there is no API version to compare; kibo checks capabilities
instead). An unreachable or unconfigured server is reported in the output and
is not a failure: the exit code is 0. kibo --version prints the client's
revision alone, without calling anything.`,
		Example:     "  kibo version\n  kibo version -o json",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{annotationNoName: "version names no object; use table, json or yaml"},
	}
	cmd.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		v := versionInfo{Client: buildinfo.Revision()}
		if rev, err := a.serverRevision(ctx, cmd); err != nil {
			v.ServerError = describe(err)
		} else {
			v.Server = rev
		}
		return a.print(v, nil, func(w io.Writer) {
			row(w, "Client revision:", v.Client)
			if v.ServerError != "" {
				row(w, "Server revision:", "unknown ("+v.ServerError+")")
			} else {
				row(w, "Server revision:", orDash(v.Server))
			}
		})
	})
	return cmd
}

// serverRevision reads the server's source_revision, within versionWait.
func (a *app) serverRevision(ctx context.Context, cmd *cobra.Command) (string, error) {
	s, err := a.settings(cmd)
	if err != nil {
		return "", err
	}
	c, err := kibotos.NewClient(s.Endpoint, kibotos.WithTLSFiles(s.CA, s.Cert, s.Key))
	if err != nil {
		return "", err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, versionWait)
	defer cancel()
	res, err := c.ServerInfoService.GetServerInfo(ctx, connect.NewRequest(&ctrlv1.GetServerInfoRequest{}))
	if err != nil {
		return "", err
	}
	return res.Msg.GetSourceRevision(), nil
}
