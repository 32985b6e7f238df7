package api

import "testing"

func TestValidServes(t *testing.T) {
	ports := map[int]bool{8000: true}
	ok := []Serve{{Kind: "mcp", Name: "notes", Port: 8000, Path: "/mcp"}, {Kind: "inference", Name: "tiny/model-1", Port: 8000, Path: "/v1"}}
	if err := ValidServes(ok, ports); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]Serve{
		{{Kind: "smtp", Name: "x", Port: 8000, Path: "/"}},
		{{Kind: "mcp", Name: "Notes", Port: 8000, Path: "/mcp"}},
		{{Kind: "mcp", Name: "a__b", Port: 8000, Path: "/mcp"}},
		{{Kind: "inference", Name: "has space", Port: 8000, Path: "/v1"}},
		{{Kind: "mcp", Name: "notes", Port: 9000, Path: "/mcp"}},
		{{Kind: "mcp", Name: "notes", Port: 8000, Path: "mcp"}},
		{{Kind: "mcp", Name: "notes", Port: 8000, Path: "/a/../../etc"}},
		{ok[0], ok[0]},
	} {
		if err := ValidServes(bad, ports); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
