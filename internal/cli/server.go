package cli

import (
	"context"
	"io"

	"github.com/spf13/cobra"
)

func (a *app) serverCommand() *cobra.Command {
	cmd := group("server", "Inspect the server", "Inspect the control plane server.")
	info := &cobra.Command{
		Use:   "info",
		Short: "Show the server's source revision and capabilities",
		Long: `Show the server's source revision and the capabilities it serves end to end
(GetServerInfo). kibo checks these names before every other command.`,
		Example:     "  kibo server info -o json",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{annotationNoName: "server info names no object; use table, json or yaml"},
	}
	info.RunE = a.action(func(ctx context.Context, cmd *cobra.Command, _ []string) error {
		s, err := a.connect(ctx, cmd, nil)
		if err != nil {
			return err
		}
		return a.print(s.info, nil, func(w io.Writer) {
			row(w, "Source revision:", orDash(s.info.GetSourceRevision()))
			row(w, "Capabilities:", "")
			for _, c := range s.info.GetCapabilities() {
				row(w, "  "+c)
			}
		})
	})
	cmd.AddCommand(info)
	return cmd
}
