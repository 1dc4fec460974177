// Command check loads compose files the way docker compose does (the
// compose-spec loader: schema, interpolation, merge keys) and fails on
// anything docker compose would refuse. scripts/check-deploy runs it where
// no docker compose is installed.
//
//	go run . -f ../compose.yaml [-env-file FILE] [-print]
//
// -print writes the resolved file (as `docker compose config` does) to stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	file := flag.String("f", "compose.yaml", "compose file")
	envFile := flag.String("env-file", "", "env file read before the environment (as compose's --env-file)")
	print := flag.Bool("print", false, "write the resolved compose file to stdout")
	flag.Parse()
	if err := check(*file, *envFile, *print); err != nil {
		fmt.Fprintln(os.Stderr, "compose check:", err)
		os.Exit(1)
	}
}

func check(file, envFile string, print bool) error {
	opts := []cli.ProjectOptionsFn{cli.WithOsEnv, cli.WithWorkingDirectory(filepath.Dir(file))}
	if envFile != "" {
		opts = append(opts, cli.WithEnvFiles(envFile), cli.WithDotEnv)
	}
	po, err := cli.NewProjectOptions([]string{file}, opts...)
	if err != nil {
		return err
	}
	p, err := po.LoadProject(context.Background())
	if err != nil {
		return err
	}
	if print {
		out, err := p.MarshalYAML()
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(out)
		return err
	}
	var names []string
	for name := range p.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	fmt.Printf("%s: valid, project %q, %d services: %s\n", file, p.Name, len(names), strings.Join(names, " "))
	return nil
}
