package main

import (
	"bufio"
	"cmp"
	"debug/elf"
	"debug/gosym"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// binaryPagesTarget is issue 51's bound on the binary's own resident pages, in bytes.
const binaryPagesTarget = 25 << 20

// pagesOf is what of a process's own executable is resident, file-backed (what RssFile counts
// of it), in bytes, and by what it holds: a text page by the package whose function it
// starts in, any other by the section and symbol it starts in (.gopclntab's tables, type
// descriptors, read-only data).
type pagesOf struct {
	total  uint64
	byWhat map[string]uint64
}

// binaryPages reads pid's mappings of its executable and, from /proc/pid/pagemap, which of
// their pages are present and file-backed (bits 63 and 61; reading them needs no privilege,
// only the frame numbers do), and names each by the executable's symbol table.
func binaryPages(pid int) (pagesOf, error) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return pagesOf{}, err
	}
	ranges, err := mappingsOf(pid, exe)
	if err != nil {
		return pagesOf{}, err
	}
	names, err := newSymbolNames(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return pagesOf{}, err
	}
	pagemap, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return pagesOf{}, err
	}
	defer func() { _ = pagemap.Close() }() // read only
	pageSize := uint64(os.Getpagesize())
	p := pagesOf{byWhat: map[string]uint64{}}
	for _, r := range ranges {
		entries := make([]byte, (r[1]-r[0])/pageSize*8)
		if _, err := pagemap.ReadAt(entries, int64(r[0]/pageSize*8)); err != nil {
			return pagesOf{}, fmt.Errorf("pagemap of %#x-%#x: %w", r[0], r[1], err)
		}
		for i := 0; i < len(entries); i += 8 {
			e := binary.LittleEndian.Uint64(entries[i:])
			if e&(1<<63) == 0 || e&(1<<61) == 0 {
				continue
			}
			addr := r[0] + uint64(i/8)*pageSize
			p.total += pageSize
			p.byWhat[names.of(addr)] += pageSize
		}
	}
	return p, nil
}

// mappingsOf is pid's mappings of the file path, as [start, end) addresses.
func mappingsOf(pid int, path string) ([][2]uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	var ranges [][2]uint64
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 6 || fields[5] != path {
			continue
		}
		start, end, _ := strings.Cut(fields[0], "-")
		a, err1 := strconv.ParseUint(start, 16, 64)
		b, err2 := strconv.ParseUint(end, 16, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("maps line %q", s.Text())
		}
		ranges = append(ranges, [2]uint64{a, b})
	}
	return ranges, s.Err()
}

// symbolNames names an address of an executable (built without PIE, as go build builds it on
// linux/amd64: its addresses are where it is mapped). Its functions are found by the Go line
// table, which a stripped executable (a test's) keeps too; its other symbols by the symbol
// table, when it has one.
type symbolNames struct {
	funcs    *gosym.Table
	syms     []elf.Symbol // sorted by address, sized
	sections []*elf.Section
}

func newSymbolNames(path string) (*symbolNames, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	text, pclntab := f.Section(".text"), f.Section(".gopclntab")
	if text == nil || pclntab == nil {
		return nil, fmt.Errorf("%s has no .text or .gopclntab", path)
	}
	data, err := pclntab.Data()
	if err != nil {
		return nil, err
	}
	funcs, err := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
	if err != nil {
		return nil, err
	}
	syms, err := f.Symbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, err
	}
	syms = slices.DeleteFunc(syms, func(s elf.Symbol) bool { return s.Size == 0 || s.Value == 0 })
	slices.SortFunc(syms, func(a, b elf.Symbol) int { return cmp.Compare(a.Value, b.Value) })
	return &symbolNames{funcs: funcs, syms: syms, sections: f.Sections}, nil
}

// of names addr: the package of the function it lies in, for text; the section and symbol
// it lies in, for anything else; the section alone between symbols.
func (n *symbolNames) of(addr uint64) string {
	section := "(headers)"
	for _, s := range n.sections {
		if s.Flags&elf.SHF_ALLOC != 0 && addr >= s.Addr && addr < s.Addr+s.Size {
			section = s.Name
			break
		}
	}
	if section == ".text" {
		if fn := n.funcs.PCToFunc(addr); fn != nil {
			return packageOf(fn.Name)
		}
		return section
	}
	i, _ := slices.BinarySearchFunc(n.syms, addr, func(s elf.Symbol, a uint64) int {
		if s.Value > a {
			return 1
		}
		return -1
	})
	if i == 0 || addr >= n.syms[i-1].Value+n.syms[i-1].Size {
		return section
	}
	name := n.syms[i-1].Name
	if strings.HasPrefix(name, "type:") {
		name = "type descriptors"
	}
	return section + " " + name
}

// packageOf is the package of a Go function's symbol: github.com/x/y.(*T).M[...] is
// github.com/x/y.
func packageOf(name string) string {
	if i := strings.IndexByte(name, '['); i >= 0 {
		name = name[:i]
	}
	slash := strings.LastIndexByte(name, '/')
	if dot := strings.IndexByte(name[slash+1:], '.'); dot >= 0 {
		return name[:slash+1+dot]
	}
	return name
}

// largest is the n largest of p's parts, largest first, as "name size" strings.
func (p pagesOf) largest(n int) []string {
	names := make([]string, 0, len(p.byWhat))
	for k := range p.byWhat {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(p.byWhat[b], p.byWhat[a]), strings.Compare(a, b)) })
	var out []string
	for _, k := range names[:min(n, len(names))] {
		out = append(out, fmt.Sprintf("%s %.1f MB", k, float64(p.byWhat[k])/(1<<20)))
	}
	return out
}
