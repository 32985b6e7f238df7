package runtimes

import (
	"reflect"
	"strings"
	"testing"
)

const (
	shaA = "3ecf70bd817346bab8feac09588673e79daf1e62714f9c78ad1659f5c81519fa"
	shaB = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestKeyOf(t *testing.T) {
	k, err := KeyOf("gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237", shaA)
	if err != nil {
		t.Fatal(err)
	}
	if want := Key("gvisor.dev_gvisor_v0.0.0-20260905035102-160fafc42237-3ecf70bd817346ba"); k != want {
		t.Fatalf("KeyOf = %q, want %q", k, want)
	}
	if !k.Valid() || k.Hash() != shaA[:16] {
		t.Fatalf("%q: Valid %v, Hash %q", k, k.Valid(), k.Hash())
	}
	// Two builds claiming one version are two keys.
	k2, _ := KeyOf("gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237", shaB)
	if k2 == k {
		t.Fatal("two hashes, one key")
	}
	// Nothing a version can say climbs out of the directory.
	for _, v := range []string{"../../etc", "..", "", "a/b\x00c", strings.Repeat("x", 500)} {
		k, err := KeyOf(v, shaA)
		if err != nil {
			t.Fatalf("KeyOf(%q): %v", v, err)
		}
		if !k.Valid() || strings.ContainsAny(string(k), "/\x00") || k == ".." {
			t.Errorf("KeyOf(%q) = %q", v, k)
		}
	}
	for _, bad := range []string{"short", "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789", shaA[:63]} {
		if _, err := KeyOf("v", bad); err == nil {
			t.Errorf("KeyOf(v, %q) took a bad hash", bad)
		}
	}
	for _, bad := range []Key{"", "x", "-" + Key(shaA[:16]), "../x-" + Key(shaA[:16]), "..-" + Key(shaA[:16]), "v-" + Key(shaA[:15]), "v-" + Key(strings.ToUpper(shaA[:16]))} {
		if bad.Valid() {
			t.Errorf("%q is valid", bad)
		}
	}
}

func TestForImage(t *testing.T) {
	for _, c := range []struct{ stamp, row, current, want Key }{
		{"a", "b", "c", "a"}, // the stamp is with the image: it wins
		{"", "b", "c", "b"},  // a checkpoint that finished while the node was down
		{"", "", "c", "c"},   // an image from before builds were kept
	} {
		if got := ForImage(c.stamp, c.row, c.current); got != c.want {
			t.Errorf("ForImage(%q, %q, %q) = %q, want %q", c.stamp, c.row, c.current, got, c.want)
		}
	}
	if ForRow("", "c") != "c" || ForRow("b", "c") != "b" {
		t.Error("ForRow")
	}
}

func TestPlan(t *testing.T) {
	for _, c := range []struct {
		name    string
		have    []Key
		current Key
		refs    []Ref
		keep    []Kept
		remove  []Key
		missing []Missing
	}{
		{
			name: "only the current build", have: []Key{"b"}, current: "b",
			keep: []Kept{{Key: "b", Current: true, Why: "current: new sandboxes and cold starts run on it"}},
		},
		{
			name: "after an upgrade: the old build runs one sandbox and wrote two snapshots",
			have: []Key{"a", "b"}, current: "b",
			refs: []Ref{{"a", Running, "1"}, {"a", Image, "2"}, {"a", Image, "3"}, {"b", Running, "4"}},
			keep: []Kept{
				{Key: "a", Running: 1, Images: 2, Why: "1 sandbox runs on it; 2 images only it restores"},
				{Key: "b", Current: true, Running: 1, Why: "current: new sandboxes and cold starts run on it; 1 sandbox runs on it"},
			},
		},
		{
			name: "nothing needs the old build any more", have: []Key{"a", "b", "c"}, current: "c",
			refs:   []Ref{{"b", Image, "1"}, {"", Running, "legacy"}},
			keep:   []Kept{{Key: "b", Images: 1, Why: "1 image only it restores"}, {Key: "c", Current: true, Why: "current: new sandboxes and cold starts run on it"}},
			remove: []Key{"a"},
		},
		{
			name: "a build that is gone is missing, not kept", have: []Key{"b"}, current: "b",
			refs:    []Ref{{"a", Image, "1"}, {"a", Running, "2"}},
			keep:    []Kept{{Key: "b", Current: true, Why: "current: new sandboxes and cold starts run on it"}},
			missing: []Missing{{Key: "a", Running: 1, Images: 1}},
		},
		{
			name: "the current build is kept with nothing on it", have: []Key{"a", "b"}, current: "a",
			keep:   []Kept{{Key: "a", Current: true, Why: "current: new sandboxes and cold starts run on it"}},
			remove: []Key{"b"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			keep, remove, missing := Plan(c.have, c.current, c.refs)
			if !reflect.DeepEqual(keep, c.keep) {
				t.Errorf("keep = %+v, want %+v", keep, c.keep)
			}
			if !reflect.DeepEqual(remove, c.remove) {
				t.Errorf("remove = %v, want %v", remove, c.remove)
			}
			if !reflect.DeepEqual(missing, c.missing) {
				t.Errorf("missing = %+v, want %+v", missing, c.missing)
			}
		})
	}
}

// TestPlanNeverRemovesWhatIsNeeded: whatever the refs, a build that is
// the current one or that a ref names is never among those removed, and
// every other build the node has is.
func TestPlanNeverRemovesWhatIsNeeded(t *testing.T) {
	keys := []Key{"a", "b", "c", "d"}
	for mask := 0; mask < 1<<8; mask++ {
		var refs []Ref
		for i, k := range keys {
			if mask&(1<<i) != 0 {
				refs = append(refs, Ref{Key: k, Use: Running})
			}
			if mask&(1<<(i+4)) != 0 {
				refs = append(refs, Ref{Key: k, Use: Image})
			}
		}
		for _, current := range keys {
			keep, remove, _ := Plan(keys, current, refs)
			needed := map[Key]bool{current: true}
			for _, r := range refs {
				needed[r.Key] = true
			}
			for _, k := range remove {
				if needed[k] {
					t.Fatalf("refs %v, current %s: %s removed", refs, current, k)
				}
			}
			if len(keep)+len(remove) != len(keys) {
				t.Fatalf("refs %v, current %s: kept %v and removed %v of %v", refs, current, keep, remove, keys)
			}
		}
	}
}
