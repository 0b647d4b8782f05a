"""ember.io"""
