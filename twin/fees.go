package twin

import (
	"math"
	"sort"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Fees on top of the fares, for a total relation (precond.go). Its judged successes — recorded successes with
// every named row known — either all pay exactly the rows' numbers times a list's length, or pay that plus a
// linear combination of the call's other numeric features: a numeric argument (the checked bags not free), or a
// list's length counted when a string argument takes one of its values (a fee per passenger when insurance is
// "yes"). The coefficients are fitted exactly on those successes: the fewest features (at most maxFees, tried in a
// fixed order) that explain every success's payment, independent of each other (each nonzero in some success),
// with more successes than coefficients + 1. With such a fit (none needed when every success paid the fares
// exactly) the relation is an equality: a call paying more or less than its total is refused, the witness's text
// rendered with the new total and sum — except a call with a feature every judged success had zero (a checked
// bag when no judged success checked one): what that costs is unknown, so the call must only pay at least the
// fares and fitted fees. Without a fit the relation is what it was: the sum paid at least the fares.

// maxFees is how many fee features a fit may use; maxGateValues how many values a string argument may take
// (over the tool's recordings) to gate a list's length.
const (
	maxFees       = 3
	maxGateValues = 4
)

// feature is one numeric feature of a call: a numeric argument, or (list set) the length of a list argument when
// the string argument arg equals val (else 0).
type feature struct {
	arg, val, list string
}

// fee is a feature and what each unit of it costs.
type fee struct {
	feature
	coef float64
}

func (f feature) value(args *jsonvalue.Object) (float64, bool) {
	v, ok := args.Get(f.arg)
	if !ok {
		return 0, false
	}
	if f.list == "" {
		return numberOf(v)
	}
	s, isStr := v.(string)
	if !isStr {
		return 0, false
	}
	l, ok := listArg(args, f.list)
	if !ok {
		return 0, false
	}
	if s != f.val {
		return 0, true
	}
	return float64(len(l)), true
}

// feeFeatures answers the candidate features of a write's recorded arguments, in a fixed order: its numeric
// arguments (sorted), then each gating string argument's values times each list argument (sorted).
func feeFeatures(all []*rec) []feature {
	nums := map[string]bool{}
	vals := map[string]map[string]bool{}
	lists := map[string]bool{}
	for _, r := range all {
		a, ok := r.args.(*jsonvalue.Object)
		if !ok {
			continue
		}
		for i, k := range a.Keys {
			switch v := a.Vals[i].(type) {
			case jsonvalue.Number:
				if _, seen := nums[k]; !seen {
					nums[k] = true
				}
			case string:
				if vals[k] == nil {
					vals[k] = map[string]bool{}
				}
				vals[k][v] = true
				nums[k] = false
			case []any:
				lists[k] = true
				nums[k] = false
			default:
				nums[k] = false
			}
		}
	}
	var out []feature
	for _, k := range sortedSet(nums) {
		if nums[k] {
			out = append(out, feature{arg: k})
		}
	}
	gates := make([]string, 0, len(vals))
	for k, vs := range vals {
		if len(vs) >= 2 && len(vs) <= maxGateValues {
			gates = append(gates, k)
		}
	}
	sort.Strings(gates)
	for _, g := range gates {
		for _, v := range sortedSet(vals[g]) {
			for _, l := range sortedSet(lists) {
				out = append(out, feature{arg: g, val: v, list: l})
			}
		}
	}
	return out
}

// fitFees fits the relation's fees on its judged successes (see above); it sets p.fees and p.exact, or leaves the
// relation inexact when no fit explains them.
func (p *precond) fitFees(all []*rec) {
	p.fees, p.exact, p.unseen = nil, false, nil
	feats := feeFeatures(all)
	var xs [][]float64 // per judged success, its features' values
	var ys []float64   // what it paid beyond the fares
	for _, r := range all {
		a, ok := r.args.(*jsonvalue.Object)
		if !ok || r.isErr {
			continue
		}
		ev := p.eval(a, p.l.recorded)
		if !ev.known {
			continue
		}
		x := make([]float64, len(feats))
		for i, f := range feats {
			if x[i], ok = f.value(a); !ok {
				x[i] = math.NaN()
			}
		}
		xs, ys = append(xs, x), append(ys, ev.sum-ev.cost)
	}
	for k := 0; k <= maxFees && len(ys) > k+1; k++ {
		if fees, ok := firstFit(feats, xs, ys, k); ok {
			p.fees, p.exact = fees, true
			p.unseen = unseenFeatures(feats, xs, fees)
			return
		}
	}
}

// unseenFeatures answers the features not among the fees that are zero (or absent) in every judged success: what
// they cost the successes cannot tell.
func unseenFeatures(feats []feature, xs [][]float64, fees []fee) []feature {
	var out []feature
next:
	for j, f := range feats {
		for _, fe := range fees {
			if fe.feature == f {
				continue next
			}
		}
		for _, x := range xs {
			if x[j] != 0 && !math.IsNaN(x[j]) {
				continue next
			}
		}
		out = append(out, f)
	}
	return out
}

// beyondSeen reports whether the call holds an unseen feature (nonzero): its total is then not known exactly, and
// it is judged by the fares and fees it must at least pay.
func (p *precond) beyondSeen(args *jsonvalue.Object) bool {
	for _, f := range p.unseen {
		if x, ok := f.value(args); ok && x != 0 {
			return true
		}
	}
	return false
}

// firstFit tries the k-subsets of the features in order; it answers the first whose least-squares coefficients
// explain every y exactly.
func firstFit(feats []feature, xs [][]float64, ys []float64, k int) ([]fee, bool) {
	idx := make([]int, k)
	for i := range idx {
		idx[i] = i
	}
	for {
		if k > len(feats) {
			return nil, false
		}
		if coef, ok := exactFit(xs, ys, idx); ok {
			fees := make([]fee, k)
			for i, j := range idx {
				fees[i] = fee{feature: feats[j], coef: coef[i]}
			}
			return fees, true
		}
		// Next k-subset in lexicographic order.
		i := k - 1
		for i >= 0 && idx[i] == len(feats)-k+i {
			i--
		}
		if i < 0 {
			return nil, false
		}
		idx[i]++
		for j := i + 1; j < k; j++ {
			idx[j] = idx[j-1] + 1
		}
	}
}

// exactFit solves the normal equations for the columns idx and checks every row's residual; a singular system
// (a feature zero in every success, or two that move together) or an unknown value is no fit.
func exactFit(xs [][]float64, ys []float64, idx []int) ([]float64, bool) {
	k := len(idx)
	m := make([][]float64, k) // k × (k+1): XᵀX | Xᵀy
	for i := range m {
		m[i] = make([]float64, k+1)
	}
	for r, x := range xs {
		for i, a := range idx {
			if math.IsNaN(x[a]) {
				return nil, false
			}
			for j, b := range idx {
				m[i][j] += x[a] * x[b]
			}
			m[i][k] += x[a] * ys[r]
		}
	}
	for c := 0; c < k; c++ {
		piv := c
		for r := c + 1; r < k; r++ {
			if math.Abs(m[r][c]) > math.Abs(m[piv][c]) {
				piv = r
			}
		}
		if math.Abs(m[piv][c]) < 1e-9 {
			return nil, false
		}
		m[c], m[piv] = m[piv], m[c]
		for r := 0; r < k; r++ {
			if r == c {
				continue
			}
			f := m[r][c] / m[c][c]
			for j := c; j <= k; j++ {
				m[r][j] -= f * m[c][j]
			}
		}
	}
	coef := make([]float64, k)
	for i := range coef {
		coef[i] = math.Round(m[i][k]/m[i][i]*1e6) / 1e6
	}
	for r, x := range xs {
		got := 0.0
		for i, a := range idx {
			got += coef[i] * x[a]
		}
		if !sameAmount(got, ys[r]) {
			return nil, false
		}
	}
	return coef, true
}

// sameAmount reports whether two amounts are equal to a millionth of their size (sums of decimal prices).
func sameAmount(a, b float64) bool {
	return math.Abs(a-b) <= 1e-6*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// feesCost answers what the call's features cost, or false when one is missing.
func (p *precond) feesCost(args *jsonvalue.Object) (float64, bool) {
	total := 0.0
	for _, f := range p.fees {
		x, ok := f.value(args)
		if !ok {
			return 0, false
		}
		total += f.coef * x
	}
	return total, true
}
