package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// A template's image layers (Template.Layers) are kept in their own
// column, written and read beside the row's others: "" for none, else
// their digests as a JSON array. Functions rather than methods: Store
// stays under the shape test's 60 methods.

// setTemplateLayers records template name's layers.
func setTemplateLayers(ctx context.Context, s *Store, name string, layers []string) error {
	if len(layers) == 0 {
		return nil
	}
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`UPDATE templates SET layers=? WHERE name=?`), mustJSON(layers), name)
	return err
}

// templateLayers fills in the layers of ts.
func templateLayers(ctx context.Context, s *Store, ts []*Template) error {
	if len(ts) == 0 {
		return nil
	}
	byName := make(map[string]*Template, len(ts))
	names := make([]any, 0, len(ts))
	for _, t := range ts {
		byName[t.Name] = t
		names = append(names, t.Name)
	}
	q := `SELECT name, layers FROM templates WHERE layers <> ''`
	if len(ts) == 1 {
		q += ` AND name=?`
	} else {
		names = nil
	}
	rows, err := s.db.QueryContext(ctx, s.q(q), names...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var name, layers string
		if err := rows.Scan(&name, &layers); err != nil {
			return err
		}
		t, ok := byName[name]
		if !ok {
			continue // registered since the list was read
		}
		if err := json.Unmarshal([]byte(layers), &t.Layers); err != nil {
			return fmt.Errorf("template %q: corrupt layers %q: %w", name, strings.TrimSpace(layers), err)
		}
	}
	return rows.Err()
}

func ptrs(ts []Template) []*Template {
	out := make([]*Template, len(ts))
	for i := range ts {
		out[i] = &ts[i]
	}
	return out
}
