package daemon

import (
	"reflect"
	"testing"

	"sandstorm/api"
	"sandstorm/internal/store"
)

func TestServedServices(t *testing.T) {
	ts := []store.Template{
		{Name: "notes", Serves: []api.Serve{{Kind: "mcp", Name: "notes", Port: 8000, Path: "/mcp"}}},
		{Name: "web"},
	}
	sbs := []api.Sandbox{
		{Name: "n2", Template: "notes", Endpoints: map[string]string{"8000": "http://10.0.0.1:20002/"}},
		{Name: "n1", Template: "notes", Endpoints: map[string]string{"8000": "http://10.0.0.1:20001"}},
		{Name: "old", Template: "notes", LeftBehind: true, Endpoints: map[string]string{"8000": "http://10.0.0.1:20003"}},
		{Name: "w", Template: "web", Endpoints: map[string]string{"8000": "http://10.0.0.1:20004"}},
		{Name: "gone", Template: "deleted-template", Endpoints: map[string]string{"8000": "http://10.0.0.1:20005"}},
	}
	want := []api.SAMServed{
		{Kind: "mcp", Name: "notes", URL: "http://10.0.0.1:20001/mcp"},
		{Kind: "mcp", Name: "notes", URL: "http://10.0.0.1:20002/mcp"},
	}
	if got := servedServices(sbs, ts); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}
