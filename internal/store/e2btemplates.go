package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"sandstorm/internal/errdefs"
)

// E2B's templates (internal/e2b/templates.go): a team names its
// templates in a namespace of its own (an alias, unique in the team), each
// template has an E2B ID, and each of its builds is a registered template
// (Template.Team set) that tags point at: "default" at the last one built.

// E2BTemplate is a team's template as E2B names it.
type E2BTemplate struct {
	ID        string
	Team      string
	Alias     string
	CreatedAt time.Time
}

// E2BTag is one tag of an E2B template: the build it points at and the
// registered template that build made.
type E2BTag struct {
	TemplateID string
	Tag        string
	BuildID    string
	Template   string
	CreatedAt  time.Time
}

// PutE2BTemplate records t; errdefs.ErrExists if its team has the alias
// or its ID is taken.
func (v TeamRows) PutE2BTemplate(ctx context.Context, t E2BTemplate) error {
	s := v.s
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now()
	}
	_, err := s.db.ExecContext(s.d.writeCtx(ctx), s.q(`INSERT INTO e2b_templates(id, team, alias, created_at) VALUES(?,?,?,?)`), t.ID, t.Team, t.Alias, ms(t.CreatedAt))
	if isConstraint(err) {
		return fmt.Errorf("template %q: %w", t.Alias, errdefs.ErrExists)
	}
	return err
}

// E2BTemplate is team's template whose alias or ID is ref, or
// errdefs.ErrNotFound (another team's is not found either).
func (v TeamRows) E2BTemplate(ctx context.Context, team, ref string) (E2BTemplate, error) {
	s := v.s
	var t E2BTemplate
	var created int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT id, team, alias, created_at FROM e2b_templates WHERE team=? AND (alias=? OR id=?) ORDER BY alias=? DESC LIMIT 1`), team, ref, ref, ref).
		Scan(&t.ID, &t.Team, &t.Alias, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("template %q: %w", ref, errdefs.ErrNotFound)
	}
	t.CreatedAt = fromMs(created)
	return t, err
}

// DeleteE2BTemplate forgets template id and its tags (its builds'
// registered templates are the caller's to delete first).
func (v TeamRows) DeleteE2BTemplate(ctx context.Context, id string) error {
	s := v.s
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM e2b_tags WHERE template_id=?`), id); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.q(`DELETE FROM e2b_templates WHERE id=?`), id)
		return err
	})
}

// SetE2BTags points each of tags of template templateID at build buildID
// (whose registered template is name), moving a tag that pointed
// elsewhere.
func (v TeamRows) SetE2BTags(ctx context.Context, templateID, buildID, name string, tags []string) error {
	s := v.s
	now := ms(time.Now())
	return s.inTx(ctx, func(tx *sql.Tx) error {
		for _, tag := range tags {
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO e2b_tags(template_id, tag, build_id, template, created_at) VALUES(?,?,?,?,?)
				ON CONFLICT (template_id, tag) DO UPDATE SET build_id=excluded.build_id, template=excluded.template, created_at=excluded.created_at`),
				templateID, tag, buildID, name, now); err != nil {
				return err
			}
		}
		return nil
	})
}

// E2BTags are template templateID's tags, by tag.
func (v TeamRows) E2BTags(ctx context.Context, templateID string) ([]E2BTag, error) {
	s := v.s
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT template_id, tag, build_id, template, created_at FROM e2b_tags WHERE template_id=? ORDER BY tag`), templateID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []E2BTag
	for rows.Next() {
		var t E2BTag
		var created int64
		if err := rows.Scan(&t.TemplateID, &t.Tag, &t.BuildID, &t.Template, &created); err != nil {
			return nil, err
		}
		t.CreatedAt = fromMs(created)
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteE2BTags removes tags of template templateID; errdefs.ErrNotFound
// if none of them was there.
func (v TeamRows) DeleteE2BTags(ctx context.Context, templateID string, tags []string) error {
	s := v.s
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		for _, tag := range tags {
			res, err := tx.ExecContext(ctx, s.q(`DELETE FROM e2b_tags WHERE template_id=? AND tag=?`), templateID, tag)
			if err != nil {
				return err
			}
			k, _ := res.RowsAffected()
			n += k
		}
		return nil
	})
	if err == nil && n == 0 {
		return fmt.Errorf("tags %v of template %s: %w", tags, templateID, errdefs.ErrNotFound)
	}
	return err
}

// inTx runs f in a transaction, committed if f returns nil.
func (s *Store) inTx(ctx context.Context, f func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit()
}
