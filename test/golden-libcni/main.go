// libcni-load: loads a CNI configuration directory the way a container runtime does, with libcni itself
// (Debian's golang-github-appc-cni-dev), and prints what it loaded as one JSON line. The installer's own
// model of the runtimes (install/cni/libcni.ts) is tested against this program's answers.
//
//   libcni-load containerd|crio DIR
//
// containerd: go-cni's loadFromConfDir with max_conf_num 1 (containerd's CRI default). go-cni is not
// packaged in Debian, so its loop is reproduced here: sorted .conf/.conflist/.json files; the first
// error from ConfListFromFile/ConfFromFile/ConfListFromConf fails the whole load; the first list that
// loads is the pod network and the loop stops there.
// crio: ocicni's loadNetworks: the same files and calls, but a file that fails is skipped (CRI-O logs it)
// and the first one that loads is the default network. ocicni's ValidateNetworkList (asking every plugin
// binary for VERSION) is not reproduced: it needs the plugins' executables, which these tests do not have.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

type skip struct {
	File  string `json:"file"`
	Error string `json:"error"`
}

type answer struct {
	OK         bool     `json:"ok"`
	File       string   `json:"file,omitempty"`
	Name       string   `json:"name"`
	CNIVersion string   `json:"cniVersion"`
	Plugins    []string `json:"plugins"`
	Error      string   `json:"error,omitempty"`
	Skipped    []skip   `json:"skipped"`
}

// load is the body both runtimes share: one file to one list, or the error that stops (containerd) or
// skips (CRI-O) it. Messages are go-cni's; paths are reduced to the file's name so that the installer's
// answers, which know only names, can be compared.
func load(file string) (*libcni.NetworkConfigList, error) {
	if strings.HasSuffix(file, ".conflist") {
		list, err := libcni.ConfListFromFile(file)
		if err != nil {
			return nil, fmt.Errorf("failed to load CNI config list file %s: %v", filepath.Base(file), err)
		}
		return list, nil
	}
	conf, err := libcni.ConfFromFile(file)
	if err != nil {
		return nil, fmt.Errorf("failed to load CNI config file %s: %v", filepath.Base(file), err)
	}
	if conf.Network.Type == "" {
		return nil, fmt.Errorf("network type not found in %s", filepath.Base(file))
	}
	list, err := libcni.ConfListFromConf(conf)
	if err != nil {
		return nil, fmt.Errorf("failed to convert CNI config file %s to list: %v", filepath.Base(file), err)
	}
	return list, nil
}

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "containerd" && os.Args[1] != "crio") {
		fmt.Fprintln(os.Stderr, "usage: libcni-load containerd|crio DIR")
		os.Exit(2)
	}
	mode, dir := os.Args[1], os.Args[2]
	out := answer{Plugins: []string{}, Skipped: []skip{}}
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		out.Error = err.Error()
	}
	sort.Strings(files)
	for _, file := range files {
		if out.Error != "" {
			break
		}
		list, err := load(file)
		if err == nil && len(list.Plugins) == 0 {
			err = fmt.Errorf("CNI config list %s has no networks, skipping", filepath.Base(file))
		}
		if err != nil {
			// Reading errors carry the full path: reduce it like the rest.
			msg := strings.ReplaceAll(err.Error(), dir+"/", "")
			if mode == "containerd" {
				out.File = filepath.Base(file)
				out.Error = msg
				break
			}
			out.Skipped = append(out.Skipped, skip{File: filepath.Base(file), Error: msg})
			continue
		}
		out.OK = true
		out.File = filepath.Base(file)
		out.Name = list.Name
		out.CNIVersion = list.CNIVersion
		for _, p := range list.Plugins {
			out.Plugins = append(out.Plugins, p.Network.Type)
		}
		break
	}
	if !out.OK && out.Error == "" {
		out.Error = "no valid networks found in " + dir
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
