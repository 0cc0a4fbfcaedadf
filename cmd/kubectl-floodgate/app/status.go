package app

import "github.com/spf13/cobra"

func newStatus(o *options) *cobra.Command { return &cobra.Command{Use: "status"} }
